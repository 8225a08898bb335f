#!/usr/bin/env bash
# Create .venv and install the project with its test tools. Idempotent.
# torch==2.13.0 goes first: it is the CPU build on local disk; a bare "torch" requirement
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"error: Python >= 3.11 is required, found {sys.version.split()[0]} (set PYTHON=...)")
PY
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
echo "setup: $(.venv/bin/python -c 'import torch, supervisor; print("torch", torch.__version__, "/ supervisor", supervisor.__version__)')"
