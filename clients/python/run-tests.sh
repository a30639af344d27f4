#!/usr/bin/env bash
# Runs the Python client's tests: `clients/python/run-tests.sh [PYTEST ARGS...]`.
#
#   1. creates (once) a virtual environment in $LOCKD_PY_VENV, default
#      ${XDG_CACHE_HOME:-$HOME/.cache}/lockd-python-venv, with $LOCKD_PYTHON (default python3);
#   2. installs this package into it as a user would (`pip install ./clients/python`, rebuilt
#      every run so the tests never see a stale copy) and test-requirements.txt;
#   3. runs pytest on tests/, whose fixtures start three-node clusters of the lockd binary named
#      by $LOCKD_BIN (required: this script builds nothing);
#   4. exits with pytest's status.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

say() { printf 'clients/python/run-tests.sh: %s\n' "$*" >&2; }

if [ -z "${LOCKD_BIN:-}" ]; then
  say "LOCKD_BIN is not set. Build the node with \`cargo build -p lockd\` and run again with"
  say "LOCKD_BIN=\${CARGO_TARGET_DIR:-target}/debug/lockd $0"
  exit 2
fi
if [ ! -x "$LOCKD_BIN" ] || [ -d "$LOCKD_BIN" ]; then
  say "LOCKD_BIN=$LOCKD_BIN is not an executable file (build it with \`cargo build -p lockd\`)"
  exit 2
fi
LOCKD_BIN="$(cd "$(dirname "$LOCKD_BIN")" && pwd)/$(basename "$LOCKD_BIN")"
export LOCKD_BIN

python="${LOCKD_PYTHON:-python3}"
venv="${LOCKD_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lockd-python-venv}"
if [ ! -x "$venv/bin/python" ]; then
  say "creating a virtual environment in $venv with $python"
  if ! "$python" -m venv "$venv"; then
    say "cannot create a virtual environment with $python (on Debian: apt-get install python3-venv)"
    exit 2
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --force-reinstall --no-deps "$here"
"${pip[@]}" install "$here" -r "$here/test-requirements.txt"

cd "$here"
# Bytecode of the tests would land in the source tree; the package's is in the venv.
export PYTHONDONTWRITEBYTECODE=1
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
exit "$status"
