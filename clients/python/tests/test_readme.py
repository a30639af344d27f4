"""The first example of clients/python/README.md runs as printed against ``lockd dev`` (TLS),
with the ``export`` lines ``lockd dev`` printed set (only its endpoint string is replaced by the
test's ``lockd dev`` ports)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from cluster import DevCluster

README = Path(__file__).resolve().parents[1] / "README.md"
#: The endpoints the example names: `lockd dev`'s.
DEV_ENDPOINTS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"


def test_the_first_example_acquires_prints_the_token_and_releases(
    dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in dev_cluster.exports.items():
        monkeypatch.setenv(name, value)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    example = blocks[0]
    assert DEV_ENDPOINTS in example
    assert len(example.strip().splitlines()) <= 11
    source = example.replace(DEV_ENDPOINTS, ",".join(dev_cluster.endpoints()))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
    printed = out.getvalue()
    assert re.search(r"^acquired, fencing token [1-9][0-9]*$", printed, re.M), printed
    assert "released: True" in printed, printed
