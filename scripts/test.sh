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
# skips those tests (about 7 minutes, run beside the others) for a quicker local run.
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
if [ "$#" -gt 0 ] || [ "${SUPERVISOR_SLURM_TESTS:-1}" = 0 ] || [ "$(id -u)" != 0 ]; then
    exec python -m pytest -p no:cacheprovider -q --durations=25 "$@"
fi
# The Slurm cluster tests (~7 minutes, mostly waiting on Slurm's daemons and timeouts) run
# beside the others, in a pytest of their own; their output follows the others'. Both must pass.
slurm_log="$(mktemp)"
trap 'rm -f "$slurm_log"' EXIT
python -m pytest -p no:cacheprovider -q --durations=10 tests/test_slurm.py >"$slurm_log" 2>&1 &
slurm_pid=$!
rc=0
python -m pytest -p no:cacheprovider -q --durations=25 --ignore=tests/test_slurm.py || rc=$?
slurm_rc=0
wait "$slurm_pid" || slurm_rc=$?
echo "---------------- tests/test_slurm.py (run beside the others) ----------------"
cat "$slurm_log"
echo "test.sh: the others exited $rc, the Slurm cluster tests $slurm_rc"
[ "$rc" = 0 ] && [ "$slurm_rc" = 0 ]
