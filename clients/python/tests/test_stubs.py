"""The committed stubs in src/lockd/v1 are what the pinned grpcio-tools generates from the
repository's proto/ today: a proto change without regenerated stubs fails here."""

from __future__ import annotations

from pathlib import Path

from stubs import PROTO_ROOT, generate, proto_files

COMMITTED = Path(__file__).resolve().parents[1] / "src" / "lockd" / "v1"


def test_the_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    assert proto_files(), f"no protos found under {PROTO_ROOT}"
    generate(str(tmp_path))
    fresh = tmp_path / "lockd" / "v1"
    generated = sorted(p.name for p in fresh.iterdir())
    committed = sorted(p.name for p in COMMITTED.iterdir() if p.name != "__init__.py" and p.name != "__pycache__")
    assert generated == committed, "the set of stub files differs; run clients/python/regen-stubs.sh"
    stale = [name for name in generated if (fresh / name).read_bytes() != (COMMITTED / name).read_bytes()]
    assert not stale, f"stale stubs {stale}; run clients/python/regen-stubs.sh"


def test_the_installed_package_uses_the_committed_stubs() -> None:
    import lockd.v1.lock_pb2 as lock_pb2

    assert lock_pb2.DESCRIPTOR.name == "lockd/v1/lock.proto"
    assert "LockService" in lock_pb2.DESCRIPTOR.services_by_name
