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
# Both run in the background so that a SIGTERM or Ctrl-C of this script ends both (bash runs a
# trap only between commands, and a background job ignores SIGINT): no pytest is left driving
# the cluster.
slurm_log="$(mktemp)"
python -m pytest -p no:cacheprovider -q --durations=10 tests/test_slurm.py >"$slurm_log" 2>&1 &
slurm_pid=$!
python -m pytest -p no:cacheprovider -q --durations=25 --ignore=tests/test_slurm.py &
main_pid=$!
stop_both() {
    trap - INT TERM
    kill -TERM "$main_pid" "$slurm_pid" 2>/dev/null || true
    wait "$main_pid" "$slurm_pid" 2>/dev/null || true
    tail -n 30 "$slurm_log"
    rm -f "$slurm_log"
    echo "test.sh: stopped" >&2
    exit 130
}
trap stop_both INT TERM
rc=0
wait "$main_pid" || rc=$?
slurm_rc=0
wait "$slurm_pid" || slurm_rc=$?
trap - INT TERM
echo "---------------- tests/test_slurm.py (run beside the others) ----------------"
cat "$slurm_log"
rm -f "$slurm_log"
echo "test.sh: the others exited $rc, the Slurm cluster tests $slurm_rc"
[ "$rc" = 0 ] && [ "$slurm_rc" = 0 ]
