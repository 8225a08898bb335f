#!/usr/bin/env bash
# Set up and run every test: install the real services the tests drive (Prometheus,
# Alertmanager, Slurm), check the layering contracts, then pytest (unit tests, real torchrun
# jobs under the supervisor, a real Slurm cluster, real Prometheus + Alertmanager).
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/install-prometheus.sh   # Debian prometheus + alertmanager for the alert tests (no-op when installed)
# Debian slurm-wlm + munge for the real multi-node Slurm tests (the test fixture starts and
# stops the cluster itself; it needs root). Opt-in until they are stable on a loaded machine.
if [ "${SUPERVISOR_SLURM_TESTS:-0}" = 1 ] && [ "$(id -u)" = 0 ]; then ./scripts/slurm-cluster.sh install; fi
export PATH="$PWD/.venv/bin:$PATH"
lint-imports
# pytest exits 5 when it collects no test: that fails this script (and CI) too.
exec python -m pytest -p no:cacheprovider -q "$@"
