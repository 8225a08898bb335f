#!/usr/bin/env bash
# Set up, then run the example job elastically on this machine under the supervisor (the
# local platform: 2 nodes in use + 1 spare, FSDP2 over gloo) with a live status view. A rank
# is killed with SIGKILL at step 60 (a restart drill): watch the supervisor detect it, pick
# the newest verified checkpoint and relaunch. Everything lands in ./demo-out (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH" OMP_NUM_THREADS=1
OUT=$(realpath -m "${1:-demo-out}")
if [ -e "$OUT" ] && [ ! -e "$OUT/.demo-out" ]; then
    echo "error: $OUT exists and was not made by this demo; choose another directory" >&2
    exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT" && touch "$OUT/.demo-out"
export TMPDIR="$OUT" SUPERVISOR_FAULT="kind=kill,rank=1,step=60,attempt=0"
supervisor launch --job demo --nnodes 1:2 --slots 3 --checkpoint-dir "$OUT/ckpt" --log-dir "$OUT/logs" \
    --heartbeat-interval 0.5 --heartbeat-timeout 3 --hang-timeout-floor 5 --metrics-linger 0 \
    -- python examples/train.py --steps 150 --checkpoint-every 10 --mode fsdp --step-sleep 0.05 \
    >"$OUT/supervisor.log" 2>&1 &
SV=$!
trap 'kill -INT $SV 2>/dev/null || true' INT TERM
sleep 3
while kill -0 "$SV" 2>/dev/null; do
    clear 2>/dev/null || true
    echo "== supervisor status --log-dir $OUT/logs   (the supervisor's own log: $OUT/supervisor.log)"
    supervisor status --log-dir "$OUT/logs" 2>/dev/null || echo "(starting...)"
    sleep 2
done
set +e
wait "$SV"
rc=$?
set -e
echo
echo "== the supervisor exited with $rc (0: completed). What it decided (events.jsonl):"
python - "$OUT/logs/events.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["event"] in ("launched", "fault_detected", "action", "restart_complete", "nodes_excluded", "job_finished"):
        extra = {k: v for k, v in e.items() if k not in ("time", "job", "event")}
        print(f"  {e['time']}  {e['event']:<17} {json.dumps(extra)[:160]}")
PY
echo
supervisor checkpoints list "$OUT/ckpt"
exit "$rc"
