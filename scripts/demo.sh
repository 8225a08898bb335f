#!/usr/bin/env bash
# Set up, then run the example job on this machine (2 ranks, gloo) with verified checkpoints:
# train, kill -9 one rank mid-run, resume from the newest checkpoint that verifies, finish,
# and show the checkpoints. Everything lands in ./demo-out (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH" TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 OMP_NUM_THREADS=1
OUT=$(realpath -m "${1:-demo-out}")
if [ -e "$OUT" ] && [ ! -e "$OUT/.demo-out" ]; then
    echo "error: $OUT exists and was not made by this demo; choose another directory" >&2
    exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT/tmp" && touch "$OUT/.demo-out"
export TMPDIR="$OUT/tmp"
ARGS=(examples/train.py --steps 60 --checkpoint-dir "$OUT/ckpt" --checkpoint-every 10 --async-save
      --log-dir "$OUT/logs" --mode fsdp)
echo "== run 1: rank 1 is killed with SIGKILL in step 37 (SUPERVISOR_FAULT)"
SUPERVISOR_FAULT="kind=kill,rank=1,step=37" torchrun --standalone --nproc-per-node 2 "${ARGS[@]}" \
    >"$OUT/run1.log" 2>&1 && { echo "expected run 1 to fail"; exit 1; }
echo "   run 1 died as planned (see $OUT/run1.log)"
supervisor checkpoints list "$OUT/ckpt" --full
echo "== run 2: the same command resumes from the newest verified checkpoint"
torchrun --standalone --nproc-per-node 2 "${ARGS[@]}" >"$OUT/run2.log" 2>&1
grep -h "checkpoint_restored" "$OUT/run2.log" | head -1
python - "$OUT/logs/rank-0.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
last = {r["step"]: r for r in recs}
print(f"   trained to step {max(last)}; final loss {last[max(last)]['loss']:.6f}; "
      f"steps re-run after the kill: {sorted(s for s in last if sum(r['step'] == s for r in recs) > 1)}")
PY
supervisor checkpoints verify "$OUT/ckpt" --full
