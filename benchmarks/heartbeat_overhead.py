"""Does the worker SDK slow a training step? One command, a table of medians, ratios in-run.

Runs the example model's training step in this process under three configurations,
interleaved block by block (the machine is shared and noisy, so every ratio compares blocks
measured side by side):

* ``baseline``: the bare step (no SDK);
* ``sdk 1 Hz``: the full SDK step protocol (phases, step timing log, heartbeat thread at the
  default 1 s, watchdog) sending authenticated UDP heartbeats to a sink in another process;
* ``sdk 20 Hz``: the same at 20 heartbeats per second (20x the default), to make any cost
  of the heartbeat thread visible.

Then the same model as a DDP script without the SDK (gloo, two ranks in two processes, one
thread each), interleaved block by block, each block a fresh pair of processes:

* ``plain DDP``: torch only, the flight recorder off;
* ``instrumented``: the same script with what the supervisor installs in a rank whose script
  lacks the SDK (:mod:`supervisor.worker.instrument`: the flight recorder on with its default
  ring, the optimizer step hook, the heartbeat thread at 1 Hz reading the recorder and sampling
  it 10 times a second, heartbeats sent to the sink).

Usage: python benchmarks/heartbeat_overhead.py [--rounds 7] [--steps 150] [--out docs/benchmarks/heartbeat_overhead.md]
"""

from __future__ import annotations

import argparse
import os
import multiprocessing as mp
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from train import DeepMLP, make_batch  # noqa: E402

from supervisor.worker.runtime import Worker  # noqa: E402
from supervisor.worker.session import Session  # noqa: E402

TOKEN = b"bench-token"


def sink(port_q) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port_q.put(s.getsockname()[1])
    while True:
        s.recv(8192)


def run_block(model, opt, worker: Worker | None, steps: int, seed_base: int) -> list[float]:
    times = []
    for i in range(steps):
        idx = list(range((seed_base + i) * 16, (seed_base + i + 1) * 16))
        t0 = time.perf_counter()
        if worker is None:
            x, y = make_batch(idx, 0, 64)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with worker.step(i + 1) as rec:
                with worker.phase("data"):
                    x, y = make_batch(idx, 0, 64)
                with worker.phase("compute"):
                    worker.fault_point()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                verdict = worker.agree(loss)
                with worker.phase("compute"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                rec.loss = verdict.loss
        times.append(time.perf_counter() - t0)
    return times


def ddp_rank(rank: int, port: int, sink_port: int, instrumented: bool, steps: int, out) -> None:
    """One rank of the two-process DDP block (a child process): its step times."""
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if instrumented:
        from supervisor.protocol import Env, new_launch_id
        from supervisor.worker import instrument

        os.environ.update({Env.HEARTBEAT_ADDR: f"127.0.0.1:{sink_port}", Env.TOKEN: "ab" * 24,
                           Env.LAUNCH: new_launch_id(), Env.AGENT_PID: str(os.getppid())})
        assert instrument.install() is not None
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(DeepMLP(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, cpu = [], []
    for i in range(steps + 30):
        idx = list(range(i * 16, (i + 1) * 16))
        t0, c0 = time.perf_counter(), time.thread_time()
        x, y = make_batch(idx, rank, 64)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    # the other threads' CPU per second while the training thread sleeps (the heartbeat thread's
    # reads and samples of the recorder, gloo's own threads): process CPU less this thread's
    p0, m0 = time.process_time(), time.thread_time()
    time.sleep(2.0)
    background = (time.process_time() - p0 - (time.thread_time() - m0)) / 2.0
    out.put((rank, (times[30:], cpu[30:], background)))  # the first 30 steps: warm-up
    dist.destroy_process_group()


def ddp_block(instrumented: bool, steps: int, sink_port: int) -> tuple[list[float], list[float], float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=ddp_rank, args=(r, port, sink_port, instrumented, steps, q)) for r in (0, 1)]
    env_before = {k: os.environ.get(k) for k in ("TORCH_FR_BUFFER_SIZE",)}
    for p in procs:
        p.start()
    got = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert env_before == {k: os.environ.get(k) for k in env_before}
    return got[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=150, help="steps per block")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "heartbeat_overhead.md")
    args = p.parse_args()
    torch.set_num_threads(1)
    q = mp.Queue()
    proc = mp.Process(target=sink, args=(q,), daemon=True)
    proc.start()
    port = q.get(timeout=10)
    torch.manual_seed(0)
    model = DeepMLP(64, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    configs = {"baseline": None, "sdk 1 Hz": 1.0, "sdk 20 Hz": 0.05}
    results: dict[str, list[float]] = {k: [] for k in configs}
    sent: dict[str, int] = {k: 0 for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        run_block(model, opt, None, 30, 0)  # warm-up
        for r in range(args.rounds):
            order = list(configs.items())
            order = order[r % len(order):] + order[: r % len(order)]  # rotate to spread drift
            for name, interval in order:
                worker = None
                if interval is not None:
                    session = Session(heartbeat_addr=("127.0.0.1", port), token=TOKEN, heartbeat_interval=interval,
                                      log_dir=Path(tmp) / name.replace(" ", "-"))
                    worker = Worker(session).start()
                times = run_block(model, opt, worker, args.steps, r * 1000)
                if worker is not None:
                    sent[name] += worker.heartbeat.sent
                    worker.close()
                results[name].extend(times)
    ddp: dict[str, list[float]] = {"plain DDP": [], "instrumented": []}
    ddp_cpu: dict[str, list[float]] = {k: [] for k in ddp}
    ddp_bg: dict[str, list[float]] = {k: [] for k in ddp}
    for r in range(args.rounds):
        for name in (list(ddp) if r % 2 == 0 else list(ddp)[::-1]):
            wall, cpu, bg = ddp_block(name == "instrumented", args.steps, port)
            ddp[name].extend(wall)
            ddp_cpu[name].extend(cpu)
            ddp_bg[name].append(bg)
    proc.terminate()
    base = statistics.median(results["baseline"])
    lines = [
        "| configuration | median step (ms) | p90 step (ms) | ratio vs baseline | heartbeats sent |",
        "|---|---|---|---|---|",
    ]
    for name, times in results.items():
        med = statistics.median(times)
        p90 = statistics.quantiles(times, n=10)[-1]
        lines.append(f"| {name} | {med * 1e3:.3f} | {p90 * 1e3:.3f} | {med / base:.3f} | {sent[name]} |")
    ddp_base = statistics.median(ddp["plain DDP"])
    lines += ["", "| script without the SDK (DDP, 2 ranks) | median step (ms) | p90 step (ms) | ratio vs plain DDP "
              "| training thread CPU per step (ms) | other threads' CPU (ms/s) |", "|---|---|---|---|---|---|"]
    for name, times in ddp.items():
        med = statistics.median(times)
        lines.append(f"| {name} | {med * 1e3:.3f} | {statistics.quantiles(times, n=10)[-1] * 1e3:.3f} | "
                     f"{med / ddp_base:.3f} | {statistics.median(ddp_cpu[name]) * 1e3:.3f} | "
                     f"{statistics.median(ddp_bg[name]) * 1e3:.2f} |")
    in_step = statistics.median(ddp_cpu["instrumented"]) - statistics.median(ddp_cpu["plain DDP"])
    thread = statistics.median(ddp_bg["instrumented"]) - statistics.median(ddp_bg["plain DDP"])
    cost = in_step + thread * ddp_base
    lines += ["", f"Instrumentation cost per step (training thread's extra CPU + the other threads' extra CPU over "
              f"one plain step): {in_step * 1e6:.1f} us + {thread * ddp_base * 1e6:.1f} us = {cost * 1e6:.1f} us, "
              f"**{100 * cost / ddp_base:.2f} %** of the plain DDP step ({ddp_base * 1e3:.3f} ms)."]
    table = "\n".join(lines)
    env = (f"torch {torch.__version__}, 1 intra-op thread, {args.rounds} rounds x {args.steps} steps per "
           f"configuration, interleaved; {time.strftime('%Y-%m-%d %H:%M')}")
    print(env)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Worker SDK overhead on a training step\n\n"
        f"Command: `python benchmarks/heartbeat_overhead.py` ({env}).\n\n"
        "The example's deep MLP (4 residual blocks, dim 64, batch 16) on one process. `baseline` is the bare "
        "step; `sdk` rows run the full step protocol (phase timers, the per-step JSON timing log, the "
        "agreement on loss/stop/save flags, the watchdog thread) and send authenticated UDP heartbeats to a "
        "sink process. Blocks of each configuration are interleaved round by round.\n\n"
        f"{table}\n\n"
        "Reading: the 1 Hz row is the default. A ratio within the run-to-run noise of the baseline means no "
        "measurable slowdown; the 20 Hz row bounds the heartbeat thread's own cost. The second table runs the "
        "same model as a two-rank DDP script without the SDK, bare and with the supervisor's instrumentation "
        "(flight recorder, optimizer step hook, heartbeat thread reading the recorder), in fresh process pairs "
        "interleaved block by block; it times rank 0's steps.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
