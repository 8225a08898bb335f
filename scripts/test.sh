#!/usr/bin/env bash
# Set up and run every test: layering contracts, then pytest (unit + real torchrun jobs).
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
lint-imports
# pytest exits 5 when it collects no test: that fails this script (and CI) too.
exec python -m pytest -p no:cacheprovider -q "$@"
