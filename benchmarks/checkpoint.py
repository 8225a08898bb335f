"""Checkpoint save/restore benchmark: supervisor.checkpoint against raw I/O, same run, same disk.

    python benchmarks/checkpoint.py [--gib 1.0] [--rounds 5] [--dir PATH]
                                    [--out docs/benchmarks/checkpoint.md]

Every row is measured once per round and the rows are interleaved (a fresh random order every
round), so slow phases of a shared, noisy machine hit every row alike. The
table reports medians; every ratio is against a baseline measured in the same run:

* save rows against a raw ``write`` + ``fsync`` of the same bytes (one file per I/O thread,
  the same thread count as the manager's writer, then an fsync of the directory);
* the async save's blocked time against our own blocking save;
* load rows against a cold raw ``readinto`` of every file of the checkpoint being loaded.

Each save goes into a fresh directory that is deleted after the measurement; ``os.sync()``
runs before every measurement so that no row pays for another's dirty pages. "Cold" means
``os.sync()`` and ``posix_fadvise(DONTNEED)`` on every file of the checkpoint just before the
measurement (the guest page cache only: a host below a VM may still cache the disk).

Single process, no ``torch.distributed`` init (the manager and DCP run with ``no_dist``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from typing import Callable

import torch
import torch.distributed.checkpoint as dcp

from supervisor.checkpoint import manager as _manager_mod  # noqa: F401  (installs DCP warning filter)
from supervisor.checkpoint.manager import CheckpointManager

warnings.filterwarnings("ignore", message="torch.distributed is disabled")
warnings.filterwarnings("ignore", category=FutureWarning)

REPO = Path(__file__).resolve().parents[1]
GiB = 1 << 30
RAW_CHUNK = 8 << 20  # write() size of the raw baseline (64 MiB and 1 MiB measured no faster)

# Targets: (row measured, baseline row, limit on median(row) / median(baseline))
TARGETS = {
    "ours_sync_save": ("raw_write", 1.25),
    "ours_async_blocked": ("ours_sync_save", 0.10),
    "ours_load_full": ("raw_read_cold", 1.30),
}

# key -> (label, baseline key or None, meaning)
ROWS: dict[str, tuple[str, str | None, str]] = {
    "raw_write": ("raw write + fsync (baseline)", None,
                  "f.write(memoryview) of every tensor's bytes in 8 MiB pieces, one file per I/O thread, fsync files + dir"),
    "dcp_save": ("bare dcp.save (defaults)", "raw_write",
                 "torch.distributed.checkpoint.save(state, checkpoint_id=dir), default FileSystemWriter"),
    "ours_sync_save": ("ours: save(step) blocking", "raw_write",
                       "CheckpointManager(root, model=m).save(step): DCP shards hashed + fsynced, manifest, rename"),
    "ours_async_blocked": ("ours: save(blocking=False), blocked", "ours_sync_save",
                           "time until save() returns (small state captured; the tensor copy runs in the background)"),
    "ours_async_staged": ("ours: save(blocking=False), copy done", "ours_sync_save",
                          "time until the background copy into reused host buffers is done: the longest the next "
                          "optimizer.step() can wait (less, by the forward/backward it overlaps)"),
    "ours_async_durable": ("ours: save(blocking=False), durable", "raw_write",
                           "time until the Future's result() returns (checkpoint published and fsynced)"),
    "raw_read_cold": ("cold raw read (baseline)", None,
                      "readinto() every file of the checkpoint into preallocated memory, after eviction"),
    "ours_load_fast": ("ours: restore(), verify fast, cold", "raw_read_cold",
                       "CheckpointManager(..., verify_on_restore='fast').restore(): sizes checked, no checksums"),
    "ours_load_full": ("ours: restore(), verify full, cold", "raw_read_cold",
                       "CheckpointManager(...).restore() with the default full verification (every checksum)"),
    "dcp_load": ("bare dcp.load, cold", "raw_read_cold",
                 "torch.distributed.checkpoint.load(state, checkpoint_id=dir) of the same checkpoint"),
}


class Model(torch.nn.Module):
    def __init__(self, n: int, numel: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter(torch.rand(numel, generator=gen), requires_grad=False) for _ in range(n)
        )


# ------------------------------------------------------------------------ helpers
def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def evict(paths: list[Path]) -> None:
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache, via util-linux ``fincore`` (None if unavailable)."""
    if shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
            capture_output=True, text=True, check=True,
        ).stdout
        return sum(int(x) for x in out.split())
    except (subprocess.CalledProcessError, ValueError):
        return None


def split_round_robin(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n)]


def git_state() -> str:
    return _common.git_state("supervisor/checkpoint")


# ------------------------------------------------------------------------ the bench
class Bench:
    def __init__(self, model: Model, base: Path, io_threads: int) -> None:
        self.model = model
        self.base = base
        self.io_threads = io_threads
        self.tensors = [p.detach() for p in model.params]
        self.counter = 0
        # Load fixture: one checkpoint written by our manager (plain DCP inside, so bare
        # dcp.load reads it too).
        fixture_root = base / "fixture"
        res = CheckpointManager(fixture_root, model=model).save(1)
        self.fixture_root = fixture_root
        self.fixture = res.path
        self.fixture_files = files_under(self.fixture)
        self.fixture_bytes = sum(p.stat().st_size for p in self.fixture_files)
        self.read_dest = torch.empty(max(p.stat().st_size for p in self.fixture_files), dtype=torch.uint8)
        self.read_dest.fill_(0)  # touch the pages now, not during the timed read
        # Async: one manager for all rounds, so staging buffers are reused as in training.
        # With an optimizer, the copy runs in the background and holds the next optimizer.step()
        # (SGD without momentum: no optimizer tensors, the state stays the model's 1 GiB).
        self.async_opt = torch.optim.SGD(model.parameters(), lr=0.0)
        self.async_mgr = CheckpointManager(base / "async", model=model, optimizer=self.async_opt)
        warm = self.async_mgr.save(self._step(), blocking=False).result()
        shutil.rmtree(warm.path)
        self._check_restore_roundtrip()

    def _step(self) -> int:
        self.counter += 1
        return self.counter

    def _fresh(self, name: str) -> Path:
        return self.base / f"{name}-{self._step()}"

    def _check_restore_roundtrip(self) -> None:
        ref = [t.clone() for t in self.tensors[:2]]
        for t in self.tensors[:2]:
            t.zero_()
        r = CheckpointManager(self.fixture_root, model=self.model).restore()
        assert r is not None and r.step == 1, r
        assert all(torch.equal(a, b) for a, b in zip(ref, self.tensors[:2])), "restore returned other bytes"
        for t in self.tensors[:2]:
            t.zero_()
        dcp.load({"model": self.model.state_dict()}, checkpoint_id=self.fixture)
        assert all(torch.equal(a, b) for a, b in zip(ref, self.tensors[:2])), "dcp.load returned other bytes"

    # -- save rows: each returns {row: seconds}
    def raw_write(self) -> dict[str, float]:
        d = self._fresh("raw")
        d.mkdir()
        groups = split_round_robin(self.tensors, self.io_threads)
        errors: list[BaseException] = []

        def work(i: int, ts: list[torch.Tensor]) -> None:
            try:
                with open(d / f"part-{i}.bin", "xb", buffering=0) as f:
                    for t in ts:
                        view = memoryview(t.numpy()).cast("B")
                        for off in range(0, len(view), RAW_CHUNK):
                            piece = view[off : off + RAW_CHUNK]
                            n = 0
                            while n < len(piece):
                                n += f.write(piece[n:])
                    os.fsync(f.fileno())
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        os.sync()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i, g)) for i, g in enumerate(groups[1:], 1)]
        for th in threads:
            th.start()
        work(0, groups[0])
        for th in threads:
            th.join()
        fsync_dir(d)
        dt = time.perf_counter() - t0
        if errors:
            raise errors[0]
        shutil.rmtree(d)
        return {"raw_write": dt}

    def dcp_save(self) -> dict[str, float]:
        d = self._fresh("dcp")
        state = {"model": self.model.state_dict()}
        os.sync()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=d)
        dt = time.perf_counter() - t0
        shutil.rmtree(d)
        return {"dcp_save": dt}

    def ours_sync_save(self) -> dict[str, float]:
        root = self._fresh("sync")
        mgr = CheckpointManager(root, model=self.model, io_threads=self.io_threads)
        os.sync()
        t0 = time.perf_counter()
        mgr.save(self._step())
        dt = time.perf_counter() - t0
        shutil.rmtree(root)
        return {"ours_sync_save": dt}

    def ours_async(self) -> dict[str, float]:
        os.sync()
        t0 = time.perf_counter()
        fut = self.async_mgr.save(self._step(), blocking=False)
        t1 = time.perf_counter()
        self.async_mgr.wait_staged()  # what the next optimizer.step() would wait for at the latest
        t_staged = time.perf_counter()
        res = fut.result()
        t2 = time.perf_counter()
        shutil.rmtree(res.path)  # keep one manager (reused buffers), but a fresh target every time
        return {"ours_async_blocked": t1 - t0, "ours_async_staged": t_staged - t0, "ours_async_durable": t2 - t0}

    # -- load rows
    def raw_read_cold(self) -> dict[str, float]:
        evict(self.fixture_files)
        dest = memoryview(self.read_dest.numpy()).cast("B")
        chunk = 64 << 20
        total = 0
        t0 = time.perf_counter()
        for p in self.fixture_files:
            with open(p, "rb", buffering=0) as f:
                off = 0
                while True:
                    n = f.readinto(dest[off : off + chunk] if off + chunk <= len(dest) else dest[off:])
                    if not n:
                        break
                    off += n
                total += off
        dt = time.perf_counter() - t0
        assert total == self.fixture_bytes, (total, self.fixture_bytes)
        return {"raw_read_cold": dt}

    def _restore(self, level: str) -> float:
        mgr = CheckpointManager(self.fixture_root, model=self.model, verify_on_restore=level)
        evict(self.fixture_files)
        t0 = time.perf_counter()
        r = mgr.restore()
        dt = time.perf_counter() - t0
        assert r is not None and r.step == 1
        return dt

    def ours_load_fast(self) -> dict[str, float]:
        return {"ours_load_fast": self._restore("fast")}

    def ours_load_full(self) -> dict[str, float]:
        return {"ours_load_full": self._restore("full")}

    def dcp_load(self) -> dict[str, float]:
        state = {"model": self.model.state_dict()}
        evict(self.fixture_files)
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=self.fixture)
        return {"dcp_load": time.perf_counter() - t0}

    def methods(self) -> list[Callable[[], dict[str, float]]]:
        return [
            self.raw_write, self.dcp_save, self.ours_sync_save, self.ours_async,
            self.raw_read_cold, self.ours_load_fast, self.ours_load_full, self.dcp_load,
        ]


# ------------------------------------------------------------------------ report
def render(samples: dict[str, list[float]], gib: float, env: list[tuple[str, str]]) -> tuple[str, list[str]]:
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    lines = [
        "| row | median s | GiB/s | min–max s | baseline | ratio (of medians) | median of per-round ratios | target | verdict |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    verdicts = []
    for key, (label, base, _) in ROWS.items():
        if key not in med:
            continue
        v = samples[key]
        rate = gib / med[key] if med[key] > 0 else float("inf")
        if base is None:
            ratio_s = paired_s = "1.00"
            base_s = "—"
        else:
            ratio = med[key] / med[base]
            paired = statistics.median(a / b for a, b in zip(v, samples[base]))
            ratio_s, paired_s, base_s = f"{ratio:.2f}", f"{paired:.2f}", ROWS[base][0].replace(" (baseline)", "")
        target_s = verdict = ""
        if key in TARGETS:
            tbase, limit = TARGETS[key]
            ratio = med[key] / med[tbase]
            target_s = f"≤ {limit:.2f}"
            verdict = "PASS" if ratio <= limit else "MISS"
            verdicts.append(f"{label}: {ratio:.2f}x {ROWS[tbase][0].replace(' (baseline)', '')} "
                            f"(target ≤ {limit:.2f}) -> {verdict}")
        lines.append(
            f"| {label} | {med[key]:.3f} | {rate:.2f} | {min(v):.3f}–{max(v):.3f} | {base_s} | {ratio_s} "
            f"| {paired_s} | {target_s} | {verdict} |"
        )
    envline = "\n".join(f"- {k}: {v}" for k, v in env)
    return "\n".join(lines) + "\n\n" + envline + "\n", verdicts


DOC_HEAD = """# Checkpoint benchmark

Produced by `{cmd}` (rerun it to refresh this file).

## Method

One process, no `torch.distributed` init. The state is a plain `nn.Module` holding
{n} fp32 tensors in a `ParameterList` ({gib:.2f} GiB in all, random values so that nothing
compresses), model only (no optimizer). Every row is measured once per round, {rounds}
rounds; inside a round the rows run one after another in an order shuffled afresh every
round, so a slow phase of this shared machine hits all rows alike. The table gives the
median of the rounds, the spread, and the ratio against a baseline measured in the same
run (as a ratio of medians, and as the median of the per-round paired ratios).

Every save writes into a fresh directory on the benchmark disk, deleted after the
measurement, and `os.sync()` runs before every measurement so no row pays for another's
dirty pages. The load rows all read one checkpoint written by `CheckpointManager` at
start-up (it is plain DCP inside, so bare `dcp.load` reads it too); before each load it is
evicted from the page cache with `os.sync()` and `posix_fadvise(POSIX_FADV_DONTNEED)` on every
file (verified with `fincore` at start-up). That empties the guest's page cache only: on a
VM the host may still serve reads from its own cache, so "cold" here is as cold as the guest
can make it.

Rows:

{rows}

Targets: our blocking save ≤ 1.25x the raw write; the time an async save blocks the caller
≤ 10% of our blocking save; a restore with full verification ≤ 1.3x the cold raw read.
A verdict compares the ratio of medians with the target.

## Results

"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="total state size (default 1.0)")
    ap.add_argument("--tensors", type=int, default=16, help="number of equal fp32 tensors (default 16)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--io-threads", type=int, default=2,
                    help="writer threads for the raw write and our manager (its default is 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the per-round row order")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where checkpoints are written (default: a temp dir, deleted at the end)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "checkpoint.md")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.gib <= 0 or args.tensors < 1:
        ap.error("--rounds, --gib and --tensors must be positive")

    numel = int(args.gib * GiB) // 4 // args.tensors
    gib = numel * 4 * args.tensors / GiB
    base_parent = args.dir if args.dir is not None else Path(tempfile.gettempdir())
    base_parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=base_parent))
    load_start = os.getloadavg()
    try:
        same_disk = os.stat(base).st_dev == os.stat(REPO).st_dev
        print(f"building {args.tensors} x {numel * 4 / (1 << 20):.0f} MiB fp32 tensors ({gib:.2f} GiB) ...",
              flush=True)
        model = Model(args.tensors, numel)
        bench = Bench(model, base, args.io_threads)
        evict(bench.fixture_files)
        res = resident_bytes(bench.fixture_files)
        evicted = "unknown (no fincore)" if res is None else f"{res} bytes resident after eviction"
        print(f"fixture {bench.fixture} ({bench.fixture_bytes / GiB:.3f} GiB, {len(bench.fixture_files)} files); "
              f"{evicted}", flush=True)

        methods = bench.methods()
        samples: dict[str, list[float]] = {k: [] for k in ROWS}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            # Every row once per round, in a fresh random order: a slow phase of the machine
            # hits every row alike, and no row always follows the same neighbour.
            order = methods[:]
            rng.shuffle(order)
            for m in order:
                gc.collect()
                for k, v in m().items():
                    samples[k].append(v)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k}={v[-1]:.2f}" for k, v in samples.items()),
                  flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    try:
        fs = subprocess.run(["df", "--output=source,fstype", str(base_parent)], capture_output=True,
                            text=True).stdout.split("\n")[1].split()
    except (OSError, IndexError):
        fs = ["?", "?"]
    cmd = "python benchmarks/checkpoint.py " + " ".join(sys.argv[1:] if argv is None else argv)
    env = [
        ("date", _dt.datetime.now().astimezone().isoformat(timespec="seconds")),
        ("command", f"`{cmd.strip()}`"),
        ("state", f"{args.tensors} x {numel * 4 / (1 << 20):.0f} MiB fp32 = {gib:.2f} GiB "
                  f"(checkpoint on disk {bench.fixture_bytes / GiB:.3f} GiB)"),
        ("rounds", str(args.rounds)),
        ("torch", torch.__version__),
        ("python", platform.python_version()),
        ("cpus", str(os.cpu_count())),
        ("kernel", platform.release()),
        ("disk", f"{base_parent} on {fs[0]} ({fs[1]}){'' if same_disk else ' — NOT the disk holding the repo'}"),
        ("io threads", f"{args.io_threads} (raw write and our manager); bare dcp.save uses its default of 1"),
        ("eviction check", evicted),
        ("load average", f"{load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end (1-minute; the machine is shared)"),
        ("code", f"git {git_state()}"),
    ]
    table, verdicts = render(samples, gib, env)
    print()
    print(table)
    for v in verdicts:
        print(v)

    rows_doc = "\n".join(f"- **{label}**: {meaning}." + (f" Ratio against *{ROWS[b][0]}*." if b else "")
                         for label, b, meaning in ROWS.values())
    doc = DOC_HEAD.format(cmd=cmd.strip(), n=args.tensors, gib=gib, rounds=args.rounds, rows=rows_doc)
    doc += table + "\nVerdicts:\n\n" + "\n".join(f"- {v}" for v in verdicts) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    marker = "<!-- analysis -->"
    if args.out.exists() and marker in args.out.read_text():
        doc += "\n" + args.out.read_text().split(marker, 1)[1].join([marker, ""])  # keep hand-written notes
    args.out.write_text(doc)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
