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
# Two lanes side by side (most of the suite waits on real processes, timeouts and daemons, so two
# pytest processes fit these 2 cores): lane A runs the Slurm cluster tests, then the Kubernetes
# and release suites (real torchrun pods on the fake cluster); lane B runs everything else. Each
# lane's output follows the run. Every pytest must pass and must have run a test (pytest exits 5
# when it collects none). Both lanes run in the background so that a SIGTERM or Ctrl-C of this
# script ends both (bash runs a trap only between commands, and a background job ignores SIGINT):
# no pytest is left driving the cluster.
LANE_A=(tests/test_kube_cluster_states.py tests/test_kube_platform.py tests/test_kube_releases.py
        tests/test_kube_release_identity.py tests/test_kube_pod_template_run.py tests/test_kube_gang_run.py
        tests/test_releases.py)
ignore=()
for f in tests/test_slurm.py "${LANE_A[@]}"; do ignore+=("--ignore=$f"); done
lane_a_log="$(mktemp)"
(
    lane_rc=0
    python -m pytest -p no:cacheprovider -q --durations=10 tests/test_slurm.py || lane_rc=1
    python -m pytest -p no:cacheprovider -q --durations=15 "${LANE_A[@]}" || lane_rc=1
    exit "$lane_rc"
) >"$lane_a_log" 2>&1 &
lane_a_pid=$!
python -m pytest -p no:cacheprovider -q --durations=25 "${ignore[@]}" &
main_pid=$!
stop_both() {
    trap - INT TERM
    kill -TERM "$main_pid" "$lane_a_pid" 2>/dev/null || true
    pkill -TERM -P "$lane_a_pid" 2>/dev/null || true
    wait "$main_pid" "$lane_a_pid" 2>/dev/null || true
    tail -n 30 "$lane_a_log"
    rm -f "$lane_a_log"
    echo "test.sh: stopped" >&2
    exit 130
}
trap stop_both INT TERM
rc=0
wait "$main_pid" || rc=$?
lane_a_rc=0
wait "$lane_a_pid" || lane_a_rc=$?
trap - INT TERM
echo "---------------- lane A: tests/test_slurm.py, then ${LANE_A[*]} (run beside the others) ----------------"
cat "$lane_a_log"
rm -f "$lane_a_log"
echo "test.sh: lane B exited $rc, lane A (Slurm cluster, then Kubernetes and releases) $lane_a_rc"
[ "$rc" = 0 ] && [ "$lane_a_rc" = 0 ]
