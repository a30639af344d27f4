"""How the committed stubs are generated: one ``grpc_tools.protoc`` run over every
``lockd/v1/*.proto`` of the repository's proto/ folder, writing ``*_pb2.py``, ``*_pb2.pyi`` and
``*_pb2_grpc.py`` under ``lockd/v1/``. Shared by regen-stubs.sh and tests/test_stubs.py, so
both run the same command."""

from __future__ import annotations

from pathlib import Path
from typing import List

#: The proto root of the repository (``import "lockd/v1/error.proto"`` resolves against it).
PROTO_ROOT = Path(__file__).resolve().parents[3] / "proto" / "proto"
#: The grpcio-tools version the committed stubs were generated with (test-requirements.txt).
GRPCIO_TOOLS_VERSION = "1.62.3"


def proto_files() -> List[Path]:
    """Every proto file of the API, sorted."""
    return sorted((PROTO_ROOT / "lockd" / "v1").glob("*.proto"))


def generate(out_dir: str) -> None:
    """Generates the stubs of :func:`proto_files` into ``out_dir`` (which gets ``lockd/v1/``)."""
    from importlib.metadata import version

    import grpc_tools
    from grpc_tools import protoc

    installed = version("grpcio-tools")
    if installed != GRPCIO_TOOLS_VERSION:
        raise RuntimeError(
            f"grpcio-tools {installed} is installed; the stubs are generated with "
            f"{GRPCIO_TOOLS_VERSION} (pip install -r test-requirements.txt)"
        )
    files = proto_files()
    if not files:
        raise RuntimeError(f"no proto files under {PROTO_ROOT}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(f.relative_to(PROTO_ROOT)) for f in files],
    ]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}: {' '.join(args)}")
