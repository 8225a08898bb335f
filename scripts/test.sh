#!/usr/bin/env bash
# Set up and run every test: install the real services the tests drive (Prometheus,
# Alertmanager, Slurm), check the layering contracts, then pytest (unit tests, real torchrun
# jobs under the supervisor, a real Slurm cluster, real Prometheus + Alertmanager).
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/install-prometheus.sh   # Debian prometheus + alertmanager for the alert tests (no-op when installed)
# Debian slurm-wlm + munge for the real multi-node Slurm tests: tests/test_slurm.py starts a
# fresh 3-node cluster (slurmctld + 3 slurmd) and stops it. It needs root; SUPERVISOR_SLURM_TESTS=0
# skips those tests (about 7 minutes) for a quicker local run.
if [ "${SUPERVISOR_SLURM_TESTS:-1}" != 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        ./scripts/slurm-cluster.sh install
    else
        echo "test.sh: not root: the Slurm cluster tests will be skipped" >&2
    fi
fi
export PATH="$PWD/.venv/bin:$PATH"
lint-imports
# pytest exits 5 when it collects no test: that fails this script (and CI) too.
exec python -m pytest -p no:cacheprovider -q --durations=25 "$@"
