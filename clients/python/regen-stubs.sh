#!/usr/bin/env bash
# Regenerates the committed stubs in src/lockd/v1 from proto/proto/lockd/v1/*.proto with the
# pinned grpcio-tools (test-requirements.txt). Run it after changing a proto; tests/test_stubs.py
# fails until the stubs match. Needs a Python with grpcio-tools installed (PYTHON, default python3).
set -euo pipefail
cd "$(dirname "$0")"
"${PYTHON:-python3}" - <<'PY'
import sys
sys.path.insert(0, "tests")
from stubs import generate
generate("src")
PY
