"""Heartbeat intake at scale: controller CPU and dead-rank detection lag at 16,384 ranks, 1 Hz.

    python benchmarks/heartbeat_intake.py [--ranks 16384 4096 1024] [--rate 1.0] [--seconds 12]
                                          [--timeout 5] [--generators 1] [--killed 200]
                                          [--tick detect|full] [--rcvbuf BYTES] [--rounds 2]
                                          [--no-scrapes] [--no-full-pass] [--profile]
                                          [--out docs/benchmarks/heartbeat_intake.md]

Target (the issue): 16,384 simulated ranks at 1 Hz, controller CPU under 50 % of one core, p99
lag between a rank's last heartbeat and its detection within 1 s of the heartbeat timeout; and
with Prometheus scraping ``/metrics`` at the shipped interval, intake + scrapes still under 50 %
of a core at 16,384 ranks, under 10,000 series per job (issue 14).

Processes (``fork``; every clock is ``time.monotonic``, CLOCK_MONOTONIC, shared by all of them):

* the *controller*: a real :class:`supervisor.controller.daemon.Controller` (config from
  ``supervisor.config.from_dict``, a platform whose methods do nothing), never ``run()``: its
  token, attempt and registry are set by hand, the UDP endpoint on 127.0.0.1 is created with
  ``lambda: Intake(controller)`` (the real class), its receive buffer sized as ``Controller.run()``
  sizes it (``_grow_receive_buffer``), and a tick loop sleeps ``TICK_S`` (0.2 s)
  between ticks like the daemon's reconcile loop. ``--tick detect`` (default) runs the real
  ``detect()`` on the controller's registry each tick; ``--tick full`` runs the daemon's real
  ``Controller._tick()`` (calibrate, straggler scores, detect, classify; no-op platform) with
  ``_recover`` replaced by a recorder so that no fault tears the simulated gang down.
  CPU is ``getrusage(RUSAGE_SELF)`` user + system over the steady window.
* *the full pass* (default; ``--no-full-pass`` skips it): the same controller with ``detect()``
  replaced by ``detect_full()``, which visits every rank on every tick (what every tick did before
  the registry indexed the ranks' deadlines, issue 28), so the incremental tick and the full pass
  are compared in the same run, with the same traffic: each tick's time, on the ticks where
  nothing was found (a healthy gang: the incremental tick answers without a pass) and on all.
* *with scrapes* (default; ``--no-scrapes`` skips it): the same controller also serves the real
  ``/metrics`` app (``supervisor.controller.http.build_app``) on 127.0.0.1, and a *scraper*
  process GETs it like Prometheus does: every ``scrape_interval`` of the shipped
  ``deploy/prometheus/prometheus.yml`` (2 s), ``Accept-Encoding: gzip``, ``scrape_timeout`` as its
  timeout. The controller records each rendering (wall and worker-thread CPU time, bytes); the
  CPU column then covers intake, ticks and scrapes together (every thread of the process).
* the *baseline*, in the same run with the same traffic: a trivial ``asyncio.DatagramProtocol``
  that only counts (no decode, no registry, no ticks): the floor of the asyncio UDP transport.
  The CPU column's ratio is ours over it.
* *load generators* (``--generators``, default 1): every frame is encoded up front with the real
  ``supervisor.protocol.encode`` (valid MAC, ``world_size=ranks``, increasing ``seq``, a new step
  each beat, as the worker SDK sends them); during the run they only ``sendto`` on a
  non-blocking socket, paced in ~2 ms batches so that rank ``r`` beats at ``t0 + (k + r/ranks)/rate``.
  ``--killed`` random ranks stop beating at random times inside the window; the generator
  records when each one's last heartbeat was sent (the time taken just before its batch).
  The controller records when ``detect()`` first names each one ``dead``; lag = detected -
  last sent - timeout.

Kernel drops: frames sent (``sendto`` returned) minus frames the controller handled (counted +
rejected), cross-checked with the ``drops`` column of ``/proc/net/udp`` for the intake socket.

A second table prices each piece of the daemon's reconcile tick on the final registry of the
``--ranks`` run (``straggler_scores`` is timed at 1,024 and 2,048 ranks and extrapolated when
larger: it is quadratic and would take many seconds).

The machine is shared: generators, baseline and controller compete for the same cores, and
loopback delivery (the receiver's socket queueing) is charged to the sender's syscall. Each
round runs the baseline and ours back to back in alternating order.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import cProfile
import gc
import inspect
import io
import json
import math
import multiprocessing as mp
import os
import platform as _platform
import pstats
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from supervisor import config as sv_config  # noqa: E402
from supervisor.controller.daemon import CALIBRATE_S, TICK_S, Controller  # noqa: E402
from supervisor.controller.intake import Intake, grow_receive_buffer  # noqa: E402
from supervisor.controller.http import EXPORTER, build_app  # noqa: E402  (loaded as the daemon has it)
from supervisor.controller import reconcile  # noqa: E402
from supervisor.health import Kind, Registry, Timeouts, calibrate, detect, straggler_scores  # noqa: E402
from supervisor.health.detect import detect_full  # noqa: E402
from supervisor.platforms.base import Platform  # noqa: E402
from supervisor import protocol  # noqa: E402
from supervisor.protocol import frames as wire  # noqa: E402
from supervisor.protocol import Heartbeat, encode  # noqa: E402

JOB = "bench"
TOKEN = b"heartbeat-intake-bench-token-0123456789abcdef"
KEY = protocol.derive_keys(TOKEN).heartbeat  # what ranks MAC their heartbeats with
LAUNCH = "b" * 32
CPU_TARGET_PCT = 50.0
LAG_TARGET_S = 1.0
DROP_TOLERANCE = 0.001  # of the frames sent
BATCH_S = 0.002
TAIL_S = 1.0      # senders keep going this long past the window (the window sees steady state)
SERIES_TARGET = 10_000
DRAIN_S = 0.5     # the controller keeps reading this long after the last frame was sent


def _duration_s(text: str) -> float:
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(f"not a Prometheus duration: {text!r}")


def shipped_scrape() -> tuple[float, float]:
    """(scrape_interval, scrape_timeout) of the supervisor job in deploy/prometheus/prometheus.yml."""
    import yaml

    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "elastic-supervisor"]
    interval = _duration_s(job.get("scrape_interval", cfg["global"].get("scrape_interval", "1m")))
    return interval, _duration_s(job.get("scrape_timeout", cfg["global"].get("scrape_timeout", "10s")))


# ------------------------------------------------------------------------ frames
def heartbeat(rank: int, world: int, k: int, per_node: int = 8) -> Heartbeat:
    """Beat ``k`` of ``rank``: the shape and size of what the worker SDK sends."""
    phase = ("data", "compute", "collective")[(rank + k) % 3]
    return Heartbeat(
        job=JOB, attempt=0, rank=rank, world_size=world, seq=k + 1, step=1000 + k, phase=phase, launch=LAUNCH,
        phase_s=round(0.0123 + (rank % 7) * 0.001, 4), node=f"node-{rank // per_node:05d}", pid=200000 + rank,
        coll_seq=3 * (1000 + k) + (phase == "collective"), coll_op="all_reduce",
        coll_inside=phase == "collective", coll_s=0.021 if phase == "collective" else 0.0,
        last_data_s=0.0121, last_compute_s=round(0.21 + (rank % 13) * 0.001, 4), last_collective_s=0.0517,
        last_step_s=round(0.29 + (rank % 13) * 0.001, 4), ckpt_step=900, ckpt_state="idle", loss_ok=True,
        loop_step_s=round(0.3 + (rank % 13) * 0.001, 4), step_median_s=round(0.29 + (rank % 11) * 0.001, 4),
        work_median_s=round(0.22 + (rank % 11) * 0.001, 4),
    )


def held_s(rank: int, per_node: int, rate: float) -> float:
    """How long a node's relay held ``rank``'s heartbeat before its frame left: the node's ranks
    beat at their own moments within the interval (spread evenly here)."""
    return round((rank % per_node + 0.5) / per_node / rate, 3)


def build_schedule(ranks: int, rate: float, total_s: float, kill_at: dict[int, float], generators: int,
                   per_node: int = 0):
    """Per generator: (send times relative to t0, frames, who is in each frame), in send order.
    ``per_node`` 0: a frame per heartbeat, its rank; else a node relay's frame per node and beat
    (``protocol.encode_node_frames``: the node's ranks not killed yet, each held ``held_s``),
    ``(rank, held)`` pairs."""
    beats = int(total_s * rate) + 1
    gens = [([], [], []) for _ in range(generators)]
    if per_node:
        nodes = -(-ranks // per_node)
        for k in range(beats):
            for n in range(nodes):
                t = (k + n / nodes) / rate
                if t > total_s:
                    break
                members = [r for r in range(n * per_node, min(ranks, (n + 1) * per_node))
                           if not (r in kill_at and t - held_s(r, per_node, rate) >= kill_at[r])]
                if not members:
                    continue
                held = [(r, held_s(r, per_node, rate)) for r in members]
                times, frames, owners = gens[n % generators]
                for frame in protocol.encode_node_frames([(heartbeat(r, ranks, k, per_node), h) for r, h in held], KEY):
                    times.append(t)
                    frames.append(frame)
                    owners.append(tuple(held))
        return gens
    for k in range(beats):
        for r in range(ranks):
            t = (k + r / ranks) / rate
            if t > total_s:
                break
            if r in kill_at and t >= kill_at[r]:
                continue
            times, frames, owners = gens[r % generators]
            times.append(t)
            frames.append(encode(heartbeat(r, ranks, k).to_payload(), KEY))
            owners.append(r)
    return gens


# ------------------------------------------------------------------------ controller process
class NullPlatform(Platform):
    kind = "null"

    async def launch(self, spec) -> None:
        pass

    async def observe(self):
        return {}

    async def kill_node(self, name: str) -> None:
        pass

    async def teardown(self, grace_s: float) -> None:
        pass

    def slots(self) -> list[str]:
        return []


class BareCounter(asyncio.DatagramProtocol):
    """The baseline: the asyncio UDP transport and a counter, nothing else."""

    def __init__(self) -> None:
        self.n = 0

    def datagram_received(self, data: bytes, addr) -> None:
        self.n += 1


def udp_drops(port: int) -> int | None:
    try:
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                parts = line.split()
                if parts[1].endswith(f":{port:04X}"):
                    return int(parts[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of every CPU of the host, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return float(sum(v) - idle), float(sum(v))


def runqueue_wait_s() -> float | None:
    """Seconds this process was runnable but waiting for a CPU (``/proc/self/schedstat``)."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def cpu_s() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def make_controller(tmp: str, ranks: int, rate: float, timeout_s: float) -> Controller:
    interval = min(60.0, max(0.05, 1.0 / rate))
    cfg = sv_config.from_dict({
        "job": JOB, "command": ["true"], "log_dir": f"{tmp}/logs", "checkpoint_dir": f"{tmp}/ckpt",
        "heartbeat": {"interval_s": interval, "timeout_s": max(timeout_s, 2 * interval)},
    })
    Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    c = Controller(cfg, NullPlatform())
    c.wire.token = TOKEN
    c.launch_id = LAUNCH
    c.attempt = 0
    c.registry.reset(0, ranks)
    c.launched_at = c.clock()
    return c


def controller_proc(conn, mode: str, ranks: int, rate: float, timeout_s: float, tick_mode: str, rcvbuf: int,
                    profile: bool, breakdown: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="hb-intake-") as tmp:
        c = make_controller(tmp, ranks, rate, timeout_s)
        asyncio.run(_serve(conn, c, mode, timeout_s, tick_mode, rcvbuf, profile, breakdown))


async def _serve(conn, c: Controller, mode: str, timeout_s: float, tick_mode: str, rcvbuf: int, profile: bool,
                 breakdown: bool) -> None:
    loop = asyncio.get_running_loop()
    ours = mode in ("intake", "scrape", "fullpass")
    factory = (lambda: Intake(c)) if ours else BareCounter
    transport, proto = await loop.create_datagram_endpoint(factory, local_addr=("127.0.0.1", 0))
    c.intake = proto if ours else None
    renders: list[tuple[float, float, float, int, int]] = []  # (when, wall s, thread CPU s, bytes, plain bytes)
    runner, http_port, exporter = None, 0, None
    if mode == "scrape":
        from aiohttp import web

        app = build_app(c)
        exporter = app[EXPORTER]
        render = exporter.render

        async def recorded(gzip_ok: bool):
            out = await render(gzip_ok)
            if not out.reused:  # (a rendering served again to a later scrape costs nothing more)
                renders.append((time.monotonic(), out.render_s, out.render_cpu_s, len(out.body), out.plain_bytes))
            return out

        exporter.render = recorded  # type: ignore[method-assign]
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sock = transport.get_extra_info("socket")
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    else:
        grow_receive_buffer(sock)  # what Controller.run() does to the intake socket
    port = sock.getsockname()[1]
    gc.collect()  # every configuration starts its window from the same settled heap
    conn.send(("ready", port, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), http_port))
    go = conn.recv()  # nothing is sent to us before this answer
    win_start, win_end, stop_at, killed = go["win_start"], go["win_end"], go["stop_at"], go["killed"]

    def handled() -> int:  # datagrams: a node frame is one (its heartbeats are counted in c.wire.received)
        if mode == "bare":
            return proto.n
        return (c.wire.node_frames if c.wire.node_frames else c.wire.received) + sum(c.wire.rejected.values())

    snaps: dict[str, Any] = {}
    prof = cProfile.Profile() if profile else None

    def snap(name: str) -> None:
        snaps[name] = (time.monotonic(), cpu_s(), handled(), handled() if mode == "bare" else c.wire.received)
        snaps[name + "_wait"] = runqueue_wait_s()
        if prof is not None:
            prof.enable() if name == "start" else prof.disable()

    gc_pauses: list[tuple[int, float]] = []  # (generation, seconds) of every collection in the window
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        elif win_start <= time.monotonic() <= win_end:
            gc_pauses.append((info["generation"], time.perf_counter() - gc_t0[0]))

    gc.callbacks.append(on_gc)
    loop.call_at(win_start, snap, "start")
    loop.call_at(win_end, snap, "end")

    episodes: dict[int, list[float]] = {}  # rank -> when each of its spells as `dead` began
    dead_before: set[int] = set()
    tick_s: list[float] = []
    tick_quiet: list[bool] = []  # per tick of tick_s: nothing was found
    detect_s: list[tuple[float, float, bool]] = []  # every detect() call: (when, seconds, nothing found)
    tick_late: list[float] = []
    faults: list[str] = []
    if ours:
        timeouts = Timeouts(heartbeat_s=timeout_s, startup_s=c.cfg.health.startup_timeout_s,
                            checkpoint_s=c.cfg.health.checkpoint_timeout_s)

        async def recorder(fault) -> None:  # --tick full: never tear the simulated gang down
            faults.append(fault.kind)

        c._recover = recorder  # type: ignore[method-assign]
        # the tick's detect() (the full pass for the configuration as before issue 28), timed on each call;
        # _tick() calls it through the reconcile module: replaced there, in this (forked) process only
        found = detect_full if mode == "fullpass" else detect

        def look(*args, **kwargs):
            t = time.perf_counter()
            out = found(*args, **kwargs)
            detect_s.append((time.monotonic(), time.perf_counter() - t, not out))
            return out

        reconcile.detect = look
        planned = None
        while loop.time() < stop_at:
            now = c.clock()
            if planned is not None and win_start <= now <= win_end:
                tick_late.append(now - planned)
            if tick_mode == "full":
                await c._tick()
                findings = c.detection.findings
            else:
                findings = look(c.registry, now, timeouts, launched_at=c.launched_at)
            done = c.clock()
            if win_start <= now <= win_end:
                tick_s.append(done - now)
                tick_quiet.append(not findings)
            dead_now = {r for f in findings if f.kind is Kind.DEAD for r in f.ranks}
            for r in dead_now - dead_before:
                episodes.setdefault(r, []).append(done)
            dead_before = dead_now
            planned = c.clock() + TICK_S
            await asyncio.sleep(TICK_S)
    else:
        await asyncio.sleep(max(0.0, stop_at - loop.time()))

    result: dict[str, Any] = {
        "port": port, "handled_total": handled(), "kernel_drops": udp_drops(port),
        "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        "rejected": dict(c.wire.rejected), "episodes": episodes,
        "tick_s": tick_s, "tick_quiet": tick_quiet, "tick_late": tick_late, "faults_recorded": len(faults),
        "detect_s": [(dt, quiet) for at, dt, quiet in detect_s if win_start <= at <= win_end],
        "registry_size": len(c.registry.ranks), "gc_pauses": gc_pauses,
    }
    transport.close()
    if runner is not None:
        await runner.cleanup()
    if mode == "scrape":
        result["renders"] = [r for r in renders if win_start <= r[0] <= win_end]
        result["scrape_shape"] = scrape_shape(c, exporter)
    if "start" in snaps and "end" in snaps:
        (t0, (u0, s0), h0, b0), (t1, (u1, s1), h1, b1) = snaps["start"], snaps["end"]
        result.update(window_s=t1 - t0, user_s=u1 - u0, sys_s=s1 - s0, handled_window=h1 - h0,
                      beats_window=b1 - b0)
        if snaps["start_wait"] is not None and snaps["end_wait"] is not None:
            result["wait_s"] = snaps["end_wait"] - snaps["start_wait"]
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(28)
        result["profile"] = out.getvalue()
    if breakdown and mode == "intake":
        result["breakdown"] = tick_breakdown(c, timeouts, tick_s)
    conn.send(result)


def scrape_shape(c: Controller, exporter) -> dict[str, Any]:
    """After the window, on the run's final registry: the series a scrape holds, and one
    rendering (snapshot on this thread, text and gzip) timed alone, best of 3."""
    from supervisor.metrics import exposition, take_snapshot

    text = exposition(take_snapshot(c.view(), exporter.state)).decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    best = _best(lambda: exporter.render_snapshot(take_snapshot(c.view(), exporter.state), True))
    return {"series": series, "alone_s": best}


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def tick_breakdown(c: Controller, timeouts: Timeouts, tick_s: list[float]) -> list[tuple[str, float, float, str]]:
    """(piece, seconds per call, how often the daemon calls it, note) for each piece of
    ``Controller._tick`` on the final registry (best of 3)."""
    reg = c.registry
    n = len(reg.ranks)
    now = c.clock()
    h = c.cfg.health
    every_calib = CALIBRATE_S  # the daemon's cadence for step statistics
    early_return = "if not self.detection.findings" in inspect.getsource(Controller._tick)
    rows: list[tuple[str, float, float, str]] = []

    def calib() -> None:
        step_times = [t for t in (rec.hb.step_median_s for rec in reg.ranks.values()) if t > 0]
        calibrate(step_times, heartbeat_s=c.cfg.heartbeat.timeout_s, startup_s=h.startup_timeout_s,
                  checkpoint_s=h.checkpoint_timeout_s, factor=h.phase_factor, floor_s=h.phase_floor_s,
                  ceiling_s=h.phase_ceiling_s)

    samples = sum(1 for rec in reg.ranks.values() if rec.hb.step_median_s > 0)
    rows.append(("calibrate(step_times)", _best(calib), every_calib,
                 f"median of {samples:,} ranks' median step times (a sort per call)"))
    rows.append(("detect()", _best(lambda: detect(reg, now, timeouts, launched_at=c.launched_at)), TICK_S,
                 f"in-run median {statistics.median(tick_s) * 1e3:.1f} ms" if tick_s else ""))

    def inputs() -> None:
        {r: rec.received for r, rec in reg.ranks.items()}
        {r: rec.received - rec.hb.phase_s for r, rec in reg.ranks.items()}
        {r: rec.hb.node for r, rec in reg.ranks.items()}
        all(r.hb.phase == "done" for r in reg.ranks.values())
        reg.min_step()

    rows.append(("classify inputs, ranks_done, min_step", _best(inputs), TICK_S,
                 "three dicts over every rank" + ("; `_tick()` builds them only on ticks with a finding"
                                                  if early_return else "")))
    small = {}
    for m in (1024, 2048):
        if m >= n:
            break
        sub = Registry(reg.attempt, m)
        sub.ranks = dict(list(reg.ranks.items())[:m])
        small[m] = _best(lambda: straggler_scores(sub), repeat=1)
    # measure it at full size unless the growth from 1,024 to 2,048 ranks predicts many seconds
    if len(small) == 2:
        exp = max(1.0, math.log2(max(small[2048], 1e-9) / max(small[1024], 1e-9)))
        predicted = small[2048] * (n / 2048) ** exp
    else:
        exp, predicted = 1.0, 0.0
    if predicted < 3.0:
        rows.append(("straggler_scores()", _best(lambda: straggler_scores(reg), repeat=1), every_calib, "measured"))
    else:
        growth = "; ".join(f"{k:,} ranks: {v * 1e3:.0f} ms" for k, v in small.items())
        rows.append(("straggler_scores()", predicted, every_calib,
                     f"extrapolated as n^{exp:.1f} from {growth} (a median over all peers per rank)"))
    return rows


# ------------------------------------------------------------------------ per-heartbeat costs
def step_costs(ranks: int, rate: float, timeout_s: float, frames: list[bytes]) -> list[tuple[str, float]]:
    """CPU µs per heartbeat of each step of the intake path, in this process: best of 5 passes over
    the run's own frames in send order, after one beat of every rank (the registry's steady state)."""
    prime, frames = frames[:ranks], frames[ranks: ranks + 30000]
    bodies = [f[3 + protocol.MAC_BYTES:] for f in frames]
    objs = [json.loads(b) for b in bodies]

    def per_frame(fn, items) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            for x in items:
                fn(x)
            best = min(best, time.process_time() - t)
        return 1e6 * best / len(items)

    out = [
        ("HMAC-SHA256 of the payload (`protocol.frames._mac`)", per_frame(lambda b: wire._mac(KEY, b), bodies)),
        ("`msgspec` decode + schema checks of the payload (`protocol.frames._WIRE_DECODER`)",
         per_frame(wire._WIRE_DECODER.decode, bodies)),
        ("`decode_heartbeat` (framing, MAC, the msgspec decode, construction)",
         per_frame(lambda f: protocol.decode_heartbeat(f, KEY), frames)),
        ("for comparison, not on the path: `json.loads` of the payload", per_frame(json.loads, bodies)),
        ("for comparison, not on the path: `Heartbeat.from_payload` (the same checks in Python)",
         per_frame(Heartbeat.from_payload, objs)),
    ]
    with tempfile.TemporaryDirectory(prefix="hb-intake-") as tmp:
        best = float("inf")
        for _ in range(5):  # a fresh registry each pass, so that every frame is new to it
            c = make_controller(tmp, ranks, rate, timeout_s)
            intake = Intake(c)
            for f in prime:
                intake.datagram_received(f, ("127.0.0.1", 9))
            c.wire.received = 0
            t = time.process_time()
            for f in frames:
                intake.datagram_received(f, ("127.0.0.1", 9))
            best = min(best, time.process_time() - t)
            assert c.wire.received == len(frames), (c.wire.received, c.wire.rejected)
        out.append(("`Intake.datagram_received` (decode, fence, `Registry.observe`)", 1e6 * best / len(frames)))
    return out


def render_costs(costs: dict[int, list[tuple[str, float]]], rows: list[dict], args) -> str:
    if not costs:
        return ""
    lines = ["| ranks | step | CPU µs per heartbeat | % of a core at ranks x rate |", "|---|---|---|---|"]
    for ranks, items in costs.items():
        rate = ranks * args.rate
        by = {(r["ranks"], r["mode"]): r for r in rows if not r["per_node"]}
        bare = by.get((ranks, "bare"))
        ours = by.get((ranks, "intake"))
        if bare:
            lines.append(f"| {ranks:,} | asyncio UDP transport (the baseline row, in-run) | {bare['us_per_hb']:.1f} | "
                         f"{bare['us_per_hb'] * rate / 1e4:.1f} |")
        for name, us in items:
            lines.append(f"| {ranks:,} | {name} | {us:.1f} | {us * rate / 1e4:.1f} |")
        if ours:
            tick = ours["tick_med_ms"] / 1e3
            share = 100.0 * tick / (TICK_S + tick)
            lines.append(f"| {ranks:,} | the tick's `detect()` (in-run median {ours['tick_med_ms']:.1f} ms per 0.2 s tick) "
                         f"| {1e6 * share / 100 / rate:.1f} | {share:.1f} |")
            lines.append(f"| {ranks:,} | **ours in the run** (the table above) | {ours['us_per_hb']:.1f} | "
                         f"{ours['cpu']:.1f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------ generator process
def generator_proc(conn, port: int, times: list[float], frames: list[bytes], owners: list[int],
                   killed: set[int]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    addr = ("127.0.0.1", port)
    conn.send("ready")
    t0, win_start, win_end = conn.recv()
    sendto = sock.sendto
    n = len(frames)
    i = sent = failed = sent_window = beats_window = 0
    last_sent: dict[int, float] = {}
    cpu0 = cpu1 = None
    while time.monotonic() < t0:
        time.sleep(0.001)
    while i < n:
        now = time.monotonic()
        rel = now - t0
        due = bisect.bisect_right(times, rel)
        in_window = win_start <= now < win_end
        while i < due:
            try:
                sendto(frames[i], addr)
            except OSError:  # BlockingIOError (socket buffer full) or ECONNREFUSED
                failed += 1
            else:
                sent += 1
                sent_window += in_window
                who = owners[i]
                if type(who) is int:
                    beats_window += in_window
                    if who in killed:
                        last_sent[who] = now
                else:  # a node frame: each rank spoke when its relay took its heartbeat
                    beats_window += in_window * len(who)
                    for rank, held in who:
                        if rank in killed:
                            last_sent[rank] = now - held
            i += 1
        if cpu0 is None and now >= win_start:
            cpu0 = cpu_s()
        if cpu1 is None and now >= win_end:
            cpu1 = cpu_s()
        if i < n:
            time.sleep(max(0.0, min(BATCH_S, times[i] - (time.monotonic() - t0))))
    cpu1 = cpu1 or cpu_s()
    cpu0 = cpu0 or cpu1
    sock.close()
    conn.send({"sent": sent, "failed": failed, "sent_window": sent_window, "beats_window": beats_window,
               "last_sent": last_sent,
               "cpu_s": (cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])})


# ------------------------------------------------------------------------ scraper process
def scraper_proc(conn, http_port: int, interval_s: float, timeout_s: float) -> None:
    """GET /metrics like Prometheus: every interval_s, gzip accepted, timeout_s at most."""
    import http.client

    conn.send("ready")
    t0, stop_at = conn.recv()
    scrapes: list[dict[str, Any]] = []
    k = 0
    while True:
        due = t0 + k * interval_s
        if due >= stop_at:
            break
        time.sleep(max(0.0, due - time.monotonic()))
        start = time.monotonic()
        rec: dict[str, Any] = {"at": start}
        try:
            h = http.client.HTTPConnection("127.0.0.1", http_port, timeout=timeout_s)
            h.request("GET", "/metrics", headers={"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"})
            resp = h.getresponse()
            body = resp.read()
            h.close()
            rec.update(status=resp.status, bytes=len(body), gzip=resp.getheader("Content-Encoding") == "gzip")
        except OSError as exc:  # socket.timeout included: a scrape that ran past scrape_timeout
            rec.update(status=0, error=type(exc).__name__)
        rec["latency_s"] = time.monotonic() - start
        scrapes.append(rec)
        k += 1
    conn.send(scrapes)


# ------------------------------------------------------------------------ one run
def run_once(mode: str, args, ranks: int, gens, kill_at: dict[int, float], profile: bool,
             per_node: int = 0) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    c_parent, c_child = ctx.Pipe()
    breakdown = mode == "intake" and not profile and args.breakdown and not per_node
    ctrl = ctx.Process(target=controller_proc, daemon=True, args=(
        c_child, mode, ranks, args.rate, args.timeout, args.tick, args.rcvbuf, profile, breakdown))
    ctrl.start()
    tag, port, rcvbuf0, http_port = c_parent.recv()
    killed = set(kill_at)
    scraper = s_parent = None
    if mode == "scrape":
        s_parent, s_child = ctx.Pipe()
        scraper = ctx.Process(target=scraper_proc, daemon=True,
                              args=(s_child, http_port, args.scrape_interval, args.scrape_timeout))
        scraper.start()
        assert s_parent.recv() == "ready"
    procs, pipes = [], []
    for times, frames, owners in gens:
        p_parent, p_child = ctx.Pipe()
        p = ctx.Process(target=generator_proc, daemon=True, args=(p_child, port, times, frames, owners, killed))
        p.start()
        procs.append(p)
        pipes.append(p_parent)
    for pp in pipes:
        assert pp.recv() == "ready"
    t0 = time.monotonic() + 0.3
    win_start, win_end = t0 + args.warmup, t0 + args.warmup + args.seconds
    stop_at = win_end + TAIL_S + DRAIN_S
    c_parent.send({"win_start": win_start, "win_end": win_end, "stop_at": stop_at, "killed": killed})
    for pp in pipes:
        pp.send((t0, win_start, win_end))
    if s_parent is not None:
        s_parent.send((t0 + 0.5, stop_at))
    time.sleep(max(0.0, win_start - time.monotonic()))
    host0, load0 = host_cpu(), os.getloadavg()[0]
    time.sleep(max(0.0, win_end - time.monotonic()))
    host1, load1 = host_cpu(), os.getloadavg()[0]
    g_res = [pp.recv() for pp in pipes]
    scrapes = s_parent.recv() if s_parent is not None else []
    res = c_parent.recv()
    for p in procs + [ctrl] + ([scraper] if scraper is not None else []):
        p.join(timeout=10)
    in_window = [x for x in scrapes if win_start <= x["at"] <= win_end]
    sent = sum(g["sent"] for g in g_res)
    last_sent: dict[int, float] = {}
    for g in g_res:
        last_sent.update(g["last_sent"])
    # a killed rank is detected by its first spell as dead after its last heartbeat left; any other
    # spell (a live rank, or a killed one before it stopped: heartbeats lost) is a false alarm
    detected: dict[int, float] = {}
    false_dead: set[int] = set()
    for r, starts in res["episodes"].items():
        after = [t for t in starts if r in last_sent and t > last_sent[r]]
        if after:
            detected[r] = after[0]
        if len(after) != len(starts) or len(after) > 1:
            false_dead.add(r)
    lags = sorted(detected[r] - last_sent[r] - args.timeout for r in detected)
    return {
        "mode": mode, "ranks": ranks, "rcvbuf": res["rcvbuf"], "rcvbuf_before": rcvbuf0,
        "cpu_pct": 100.0 * (res["user_s"] + res["sys_s"]) / res["window_s"],
        "user_pct": 100.0 * res["user_s"] / res["window_s"], "sys_pct": 100.0 * res["sys_s"] / res["window_s"],
        "handled_per_s": res["handled_window"] / res["window_s"],
        "sent": sent, "send_failed": sum(g["failed"] for g in g_res), "handled": res["handled_total"],
        "dropped": sent - res["handled_total"], "kernel_drops": res["kernel_drops"],
        "gen_cpu_pct": 100.0 * sum(g["cpu_s"] for g in g_res) / args.seconds,
        "rejected": res["rejected"], "lags": lags, "killed": len(kill_at), "detected": len(detected),
        "false_dead": sorted(false_dead), "tick_s": res["tick_s"], "tick_quiet": res["tick_quiet"],
        "detect_s": res["detect_s"],
        "tick_late": res["tick_late"],
        "faults_recorded": res["faults_recorded"], "profile": res.get("profile"),
        "breakdown": res.get("breakdown"), "registry_size": res["registry_size"],
        # per heartbeat, not per datagram: a node frame carries several (the bare counter sees datagrams only)
        "us_per_hb": 1e6 * (res["user_s"] + res["sys_s"]) / max(1, res["beats_window"] if mode != "bare" else
                                                                 sum(g["beats_window"] for g in g_res)),
        "gc_s": sum(t for _, t in res["gc_pauses"]), "gc_max_s": max((t for _, t in res["gc_pauses"]), default=0.0),
        "gc_full": sum(1 for g, _ in res["gc_pauses"] if g == 2),
        "wait_pct": 100.0 * res.get("wait_s", float("nan")) / res["window_s"],
        "offered_per_s": sum(g["beats_window"] for g in g_res) / args.seconds,
        "host_busy_pct": 100.0 * (host1[0] - host0[0]) / max(1e-9, host1[1] - host0[1]),
        "load": (load0 + load1) / 2,
        "scrapes": in_window, "renders": res.get("renders", []), "scrape_shape": res.get("scrape_shape"),
    }


# ------------------------------------------------------------------------ reporting
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def fmt_rcvbuf(b: int) -> str:
    return f"{b / 1024:.0f} KiB" if b < 1 << 20 else f"{b / (1 << 20):.1f} MiB"


def git_state() -> str:
    return _common.git_state("supervisor")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[16384, 4096, 1024], help="one row per value")
    p.add_argument("--node-ranks", type=int, nargs="*", default=[131072],
                   help="rows whose heartbeats come in node relays' frames (--per-node ranks each), in the same run")
    p.add_argument("--per-node", type=int, default=8, help="ranks per node in the --node-ranks rows")
    p.add_argument("--rate", type=float, default=1.0, help="heartbeats per rank per second")
    p.add_argument("--seconds", type=float, default=12.0, help="measured steady window per run")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before the window (every rank heard)")
    p.add_argument("--timeout", type=float, default=5.0, help="heartbeat timeout (heartbeat.timeout_s)")
    p.add_argument("--generators", type=int, default=1, help="load generator processes")
    p.add_argument("--killed", type=int, default=200, help="ranks that stop beating inside the window")
    p.add_argument("--tick", choices=("detect", "full"), default="detect",
                   help="detect: detect() every tick; full: the daemon's Controller._tick() minus recovery")
    p.add_argument("--rcvbuf", type=int, default=0,
                   help="SO_RCVBUF for the intake socket (0: what Controller.run() sets, the same for the baseline)")
    p.add_argument("--rounds", type=int, default=2, help="baseline/ours pairs per row, order alternating (medians)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="also run ours once under cProfile (controller window) and print the top functions")
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false", help="skip the tick cost table")
    p.add_argument("--no-scrapes", dest="scrapes", action="store_false",
                   help="skip the configuration with Prometheus-style scrapes of /metrics")
    p.add_argument("--no-full-pass", dest="full_pass", action="store_false",
                   help="skip the configuration whose every tick visits every rank (detect_full)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "heartbeat_intake.md")
    args = p.parse_args(argv)
    if args.seconds < args.timeout + 2 / args.rate + 2:
        p.error("--seconds must leave room for the timeout and detection: >= timeout + 2/rate + 2")
    args.warmup = max(args.warmup, 2.0 / args.rate)
    args.scrape_interval, args.scrape_timeout = shipped_scrape()
    total_s = args.warmup + args.seconds + TAIL_S
    rng = random.Random(args.seed)

    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    breakdowns: dict[int, Any] = {}
    costs: dict[int, list[tuple[str, float]]] = {}
    profiles: dict[int, str] = {}
    started = time.strftime("%Y-%m-%d %H:%M")
    for ranks, per_node in [(r, 0) for r in args.ranks] + [(r, args.per_node) for r in args.node_ranks]:
        n_kill = min(args.killed, ranks // 10)
        lo, hi = args.warmup + 1.0 / args.rate, args.warmup + args.seconds - args.timeout - 1.0 / args.rate - 1.0
        kill_at = {r: rng.uniform(lo, hi) for r in rng.sample(range(ranks), n_kill)}
        t = time.perf_counter()
        gens = build_schedule(ranks, args.rate, total_s, kill_at, args.generators, per_node)
        n_frames = sum(len(g[1]) for g in gens)
        size = statistics.median(len(f) for f in gens[0][1][:1000])
        shape = f"node frames of {per_node} ranks" if per_node else "a frame per heartbeat"
        print(f"[{ranks} ranks, {shape}] encoded {n_frames:,} frames ({size:.0f} B each) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        modes = (("bare", "intake") + (("fullpass",) if args.full_pass and not per_node else ())
                 + (("scrape",) if args.scrapes else ()))
        per_mode: dict[str, list[dict]] = {m: [] for m in modes}
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                r = run_once(mode, args, ranks, gens, kill_at, profile=False, per_node=per_node)
                r["round"] = rnd
                per_mode[mode].append(r)
                runs.append(r)
                lag = (f" lag p50/p99/max {pct(r['lags'], .5):.3f}/{pct(r['lags'], .99):.3f}/{max(r['lags'], default=float('nan')):.3f} s"
                       if mode != "bare" else "")
                if mode == "scrape":
                    ok = sum(1 for x in r["scrapes"] if x.get("status") == 200)
                    lag += (f" scrapes {ok}/{len(r['scrapes'])} ok, render p50 "
                            f"{1e3 * pct([x[1] for x in r['renders']], .5):.1f} ms, "
                            f"{statistics.median([x[3] for x in r['renders']] or [0]):,.0f} B")
                print(f"  round {rnd} {mode:6s}: cpu {r['cpu_pct']:5.1f}% (usr {r['user_pct']:.1f} sys {r['sys_pct']:.1f})"
                      f" handled/s {r['handled_per_s']:8.0f} sent {r['sent']:,} dropped {r['dropped']:,}"
                      f" (kernel {r['kernel_drops']}) send_failed {r['send_failed']} gen cpu {r['gen_cpu_pct']:.1f}%"
                      f" rcvbuf {r['rcvbuf']} {r['us_per_hb']:.1f} us/hb host busy {r['host_busy_pct']:.0f}%"
                      f" load {r['load']:.1f} runq wait {r['wait_pct']:.0f}% gc {r['gc_s'] * 1e3:.0f} ms (max {r['gc_max_s'] * 1e3:.0f} ms, "
                      f"{r['gc_full']} full){lag}", flush=True)
        if args.profile:
            r = run_once("intake", args, ranks, gens, kill_at, profile=True, per_node=per_node)
            profiles[ranks] = r["profile"]
            print(f"--- cProfile of the controller over the window ({ranks} ranks; CPU {r['cpu_pct']:.1f}% with the "
                  f"profiler on) ---\n{r['profile']}", flush=True)
        if args.breakdown and args.generators == 1 and not per_node:
            costs[ranks] = step_costs(ranks, args.rate, args.timeout, gens[0][1])
        del gens
        bare, ours = per_mode["bare"], per_mode["intake"]
        scraped = per_mode.get("scrape", [])
        full = per_mode.get("fullpass", [])
        b_cpu = statistics.median(x["cpu_pct"] for x in bare)
        o_cpu = statistics.median(x["cpu_pct"] for x in ours)
        for x in ours + full + scraped:
            if x["rejected"]:
                notes.append(f"{ranks} ranks: rejected {x['rejected']}")
            if x["registry_size"] != ranks:
                notes.append(f"{ranks} ranks: registry held {x['registry_size']} ranks at the end")
        if not per_node:
            breakdowns[ranks] = ours[-1]["breakdown"]
        tick_name = "detect()" if args.tick == "detect" else "_tick()"
        via = f" — node frames, {per_node} ranks each (issue 28)" if per_node else ""
        configs = [("bare", "bare asyncio UDP counter (baseline)" + via, bare),
                   ("intake", f"ours: Intake + Registry + {tick_name} every 0.2 s" + via, ours)]
        if full:
            configs.append(("fullpass", f"ours, {tick_name} with a full pass over the ranks every 0.2 s "
                                        "(detect_full(): before issue 28)", full))
        if scraped:
            configs.append(("scrape", f"ours + Prometheus-style scrapes of /metrics every {args.scrape_interval:g} s "
                                      "(gzip)" + via, scraped))
        for mode, label, rs in configs:
            cpu = statistics.median(x["cpu_pct"] for x in rs)
            is_ours = mode != "bare"
            lags = sorted(lag for x in rs for lag in x["lags"])
            detected = sum(x["detected"] for x in rs)
            killed = sum(x["killed"] for x in rs)
            false_dead = sorted({r for x in rs for r in x["false_dead"]})
            ticks = [t for x in rs for t in x["tick_s"]]
            quiet = [t for x in rs for t, q in zip(x["tick_s"], x["tick_quiet"]) if q]
            looks = [t for x in rs for t, q in x["detect_s"] if q]
            late = [t for x in rs for t in x["tick_late"]]
            row = {
                "ranks": ranks, "label": label, "rate": args.rate, "mode": mode, "per_node": per_node,
                "handled_per_s": statistics.median(x["handled_per_s"] for x in rs),
                "sent": sum(x["sent"] for x in rs), "dropped": sum(x["dropped"] for x in rs),
                "kernel_drops": sum(x["kernel_drops"] or 0 for x in rs), "rcvbuf": rs[0]["rcvbuf"],
                "cpu": cpu, "usr": statistics.median(x["user_pct"] for x in rs),
                "sys": statistics.median(x["sys_pct"] for x in rs), "ratio": cpu / b_cpu if b_cpu else float("nan"),
                "gen_cpu": statistics.median(x["gen_cpu_pct"] for x in rs), "is_ours": is_ours,
                "us_per_hb": statistics.median(x["us_per_hb"] for x in rs),
                "host_busy": statistics.median(x["host_busy_pct"] for x in rs),
                "load": statistics.median(x["load"] for x in rs),
                "wait": statistics.median(x["wait_pct"] for x in rs),
                # CPU per handled heartbeat (ticks included) times the offered rate: what the controller
                # would have used had it handled every heartbeat (an upper bound: ticks do not scale)
                "cpu_full": statistics.median(x["us_per_hb"] * x["offered_per_s"] / 1e4 for x in rs),
            }
            if is_ours:
                row |= {"lag50": pct(lags, .5), "lag99": pct(lags, .99), "lagmax": max(lags, default=float("nan")),
                        "detected": detected, "killed": killed, "false_dead": len(false_dead),
                        "tick_med_ms": 1e3 * statistics.median(ticks) if ticks else float("nan"),
                        "tick_max_ms": 1e3 * max(ticks, default=float("nan")),
                        "tick_p99_ms": 1e3 * pct(ticks, .99), "ticks_n": len(ticks), "quiet_n": len(quiet),
                        "quiet_med_ms": 1e3 * statistics.median(quiet) if quiet else float("nan"),
                        "detect_quiet_med_ms": 1e3 * statistics.median(looks) if looks else float("nan"),
                        "detect_med_ms": 1e3 * statistics.median(t for x in rs for t, _ in x["detect_s"])
                        if any(x["detect_s"] for x in rs) else float("nan"),
                        "late_p99_ms": 1e3 * pct(late, .99),
                        "gc_max_ms": 1e3 * max(x["gc_max_s"] for x in rs)}
                # CPU is judged at the offered rate: a controller that dropped heartbeats did less work
                drops_ok = row["dropped"] <= DROP_TOLERANCE * row["sent"]
                cpu_ok = max(cpu, row["cpu_full"]) < CPU_TARGET_PCT
                lag_ok = bool(lags) and row["lag99"] <= LAG_TARGET_S and detected == killed and not false_dead
                row["verdict"] = (f"CPU {'PASS' if cpu_ok else 'MISS'}, drops {'PASS' if drops_ok else 'MISS'}, "
                                  f"lag {'PASS' if lag_ok else 'MISS'}")
            if mode == "scrape":
                row |= scrape_summary(rs, o_cpu, b_cpu, args)
            rows.append(row)

    env = (f"Python {_platform.python_version()}, {os.cpu_count()} CPUs ({_platform.processor() or _platform.machine()}), "
           f"{args.generators} generator process(es), {args.rounds} round(s), {args.seconds:g} s window after "
           f"{args.warmup:g} s warm-up, timeout {args.timeout:g} s, tick {args.tick}, git {git_state()}, {started}")
    main_table = "\n\n".join(t for t in (render_main(rows), render_aggregation(rows)) if t)
    scrape_table = render_scrapes(rows, args)
    tick_table = render_breakdown(breakdowns, args)
    cost_table = render_costs(costs, rows, args)
    full_table = render_full_pass(rows, args)
    print()
    print(env)
    print(main_table)
    for extra in (full_table, scrape_table, cost_table, tick_table):
        if extra:
            print()
            print(extra)
    for n in notes:
        print("note:", n)
    argv_str = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    write_doc(args, env, main_table, full_table, scrape_table, tick_table, cost_table, render_runs(runs),
              reading(rows, breakdowns), notes, profiles, argv_str)
    print(f"\nwrote {args.out}")
    return 0


def render_main(rows: list[dict]) -> str:
    lines = [
        "| ranks | rate | configuration | handled/s | sent | dropped (kernel) | SO_RCVBUF | controller CPU % of a core "
        "(usr+sys) | ratio vs baseline | CPU µs per heartbeat | CPU % at the offered rate | waiting for a CPU % | "
        "generators CPU % | "
        "host busy % (load) | "
        "tick median / max (ms) | dead detected | lag past timeout p50 / p99 / max (s) | "
        "targets: CPU < 50 %, drops < 0.1 %, lag p99 <= 1 s, no false dead |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = (f"| {r['ranks']:,} | {r['rate']:g} Hz | {r['label']} | {r['handled_per_s']:,.0f} | {r['sent']:,} | "
                f"{r['dropped']:,} ({r['kernel_drops']:,}) | {fmt_rcvbuf(r['rcvbuf'])} | "
                f"{r['cpu']:.1f} ({r['usr']:.1f}+{r['sys']:.1f}) | {r['ratio']:.2f} | {r['us_per_hb']:.1f} | "
                f"{r['cpu_full']:.1f} | {r['wait']:.0f} | "
                f"{r['gen_cpu']:.1f} | {r['host_busy']:.0f} ({r['load']:.1f}) | ")
        if r["is_ours"]:
            false = f", {r['false_dead']} false" if r["false_dead"] else ""
            base += (f"{r['tick_med_ms']:.1f} / {r['tick_max_ms']:.1f} | {r['detected']}/{r['killed']}{false} | "
                     f"{r['lag50']:.3f} / {r['lag99']:.3f} / {r['lagmax']:.3f} | {r['verdict']} |")
        else:
            base += "- | - | - | - |"
        lines.append(base)
    return "\n".join(lines)


def render_aggregation(rows: list[dict]) -> str:
    """What node frames buy: each node-frame row against the largest per-rank row of the same run."""
    per_rank = [r for r in rows if not r["per_node"] and r["mode"] in ("intake", "scrape")]
    nodes = [r for r in rows if r["per_node"] and r["mode"] in ("intake", "scrape")]
    if not per_rank or not nodes:
        return ""
    lines = ["What aggregation buys (same run, same controller): CPU per heartbeat with a frame per heartbeat "
             "against node frames, and what each path would take at 131,072 ranks x 1 Hz.", "",
             "| configuration | ranks | datagrams/s | CPU µs per heartbeat | CPU % of a core at 131,072 ranks x 1 Hz "
             "(µs x 131,072 / 10^4) | ratio (per-rank / node frames) |", "|---|---|---|---|---|---|"]
    for n in nodes:
        base = max((r for r in per_rank if r["mode"] == n["mode"]), key=lambda r: r["ranks"], default=None)
        if base is None:
            continue
        for r in (base, n):
            ratio = f"{base['us_per_hb'] / r['us_per_hb']:.2f}x" if r is n else "1.00x"
            lines.append(f"| {r['label']} | {r['ranks']:,} | {r['handled_per_s']:,.0f} | {r['us_per_hb']:.1f} | "
                         f"{r['us_per_hb'] * 131_072 / 1e4:.0f} | {ratio} |")
    return "\n".join(lines)


def render_full_pass(rows: list[dict], args) -> str:
    """The incremental tick against the full pass, both measured in this run with the same traffic."""
    by = {(r["ranks"], r["mode"]): r for r in rows if not r["per_node"]}
    pairs = [(by[k], by[(k[0], "fullpass")]) for k in by if k[1] == "intake" and (k[0], "fullpass") in by]
    if not pairs:
        return ""

    def both(inc: dict, full: dict, key: str, digits: int = 3) -> str:
        a, b = inc[key], full[key]
        ratio = f"{b / a:,.1f}x" if a > 0 and math.isfinite(b / a) else "-"
        return f"{a:.{digits}f} / {b:.{digits}f} | {ratio}"

    tick = "detect()" if args.tick == "detect" else "Controller._tick()"
    lines = ["| ranks | ticks that found nothing (of all): incremental / full pass | on those, detect() median ms: "
             f"incremental / full pass | ratio | on those, the whole tick ({tick}) median ms | ratio | all ticks, "
             "detect() median ms | ratio | all ticks, the whole tick median ms | ratio | controller CPU % of a core "
             "(intake and ticks) | ratio |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for inc, full in pairs:
        lines.append(
            f"| {inc['ranks']:,} | {inc['quiet_n']} ({inc['ticks_n']}) / {full['quiet_n']} ({full['ticks_n']}) | "
            f"{both(inc, full, 'detect_quiet_med_ms')} | {both(inc, full, 'quiet_med_ms', 2)} | "
            f"{both(inc, full, 'detect_med_ms')} | {both(inc, full, 'tick_med_ms', 2)} | {both(inc, full, 'cpu', 1)} |")
    return "\n".join(lines)


def render_runs(runs: list[dict]) -> str:
    lines = ["| ranks | round | configuration | controller CPU % | waiting for a CPU % | handled/s | dropped | "
             "host busy % (load) | longest GC pause (ms) | lag p99 (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lag = f"{pct(r['lags'], .99):.3f}" if r["mode"] != "bare" else "-"
        name = {"bare": "baseline", "intake": "ours", "fullpass": "ours, full pass",
                "scrape": "ours + scrapes"}[r["mode"]]
        lines.append(f"| {r['ranks']:,} | {r['round']} | {name} | "
                     f"{r['cpu_pct']:.1f} | {r['wait_pct']:.0f} | {r['handled_per_s']:,.0f} | {r['dropped']:,} | "
                     f"{r['host_busy_pct']:.0f} ({r['load']:.1f}) | {r['gc_max_s'] * 1e3:.0f} | {lag} |")
    return "\n".join(lines)


def reading(rows: list[dict], breakdowns: dict[int, Any]) -> list[str]:
    """What the numbers say, derived from them (so that the prose cannot go stale)."""
    out = []
    for r in rows:
        if not r["is_ours"]:
            continue
        nodes = f" in node frames of {r['per_node']}" if r["per_node"] else ""
        head = f"{r['ranks']:,} ranks{nodes}{', with scrapes' if r['mode'] == 'scrape' else ''}: {r['verdict']}."
        if r["mode"] == "scrape":
            head += (f" {r['series']:,} series per scrape (target < {SERIES_TARGET:,}: "
                     f"{'PASS' if r['series'] < SERIES_TARGET else 'MISS'}), {r['scrape_bytes']:,.0f} B gzipped; "
                     f"scrapes took {r['scrape_cost_pct']:+.1f} % of a core.")
        why = []
        if r["dropped"] > DROP_TOLERANCE * r["sent"]:
            share = 100.0 * r["dropped"] / r["sent"]
            if r["rcvbuf"] < 1 << 20:
                why.append(f"{share:.1f} % of the heartbeats were dropped by the kernel: a {fmt_rcvbuf(r['rcvbuf'])} "
                           "receive buffer holds about 10 ms of 16,384 heartbeats/s, less than one detect() tick")
            else:
                why.append(f"{share:.1f} % of the heartbeats were dropped by the kernel with a "
                           f"{fmt_rcvbuf(r['rcvbuf'])} buffer: the controller spent {r['wait']:.0f} % of the "
                           f"window runnable but waiting for a CPU (host {r['host_busy']:.0f} % busy, load "
                           f"{r['load']:.1f}; longest tick {r['tick_max_ms']:.0f} ms, longest GC pause "
                           f"{r['gc_max_ms']:.0f} ms)")
        if r["false_dead"]:
            why.append(f"{r['false_dead']} live ranks were reported dead (their heartbeats were lost)")
        if max(r["cpu"], r["cpu_full"]) >= CPU_TARGET_PCT:
            why.append(f"the controller used {r['cpu']:.1f} % of a core ({r['cpu_full']:.1f} % projected to every "
                       f"heartbeat offered), {r['ratio']:.2f}x the bare transport's {r['cpu'] / r['ratio']:.1f} %")
        out.append(head + (" " + "; ".join(why) + "." if why else ""))
    for ranks, pieces in breakdowns.items():
        for name, sec, every, note in pieces or []:
            if sec > TICK_S:
                out.append(f"{ranks:,} ranks: `{name}` takes {sec:,.1f} s per call ({note}); the daemon's "
                           f"`Controller._tick()` calls it every {every:g} s"
                           + (", so a controller running the full tick falls behind at this size whatever the "
                              "intake costs." if sec > every else "."))
    return out


def render_breakdown(breakdowns: dict[int, Any], args) -> str:
    if not any(breakdowns.values()):
        return ""
    lines = ["| ranks | piece of Controller._tick | ms per call | the daemon calls it every (s) | % of a core at that "
             "rate | note |", "|---|---|---|---|---|---|"]
    for ranks, rows in breakdowns.items():
        if not rows:
            continue
        for name, sec, every, note in rows:
            share = 100.0 * sec / (every + sec)
            lines.append(f"| {ranks:,} | {name} | {sec * 1e3:,.1f} | {every:g} | {share:.1f} | {note} |")
    return "\n".join(lines)


def write_doc(args, env: str, main_table: str, full_table: str, scrape_table: str, tick_table: str, cost_table: str,
              runs_table: str, read: list[str], notes, profiles, argv_str: str) -> None:
    cmd = "python benchmarks/heartbeat_intake.py" + (f" {argv_str}" if argv_str else "")
    parts = [
        "# Heartbeat intake at scale\n",
        f"Command: `{cmd}`\n\n({env}.)\n",
        "Target: 16,384 ranks at 1 Hz, controller CPU under 50 % of one core, p99 lag between a rank's last "
        "heartbeat and its detection within 1 s of the heartbeat timeout; with Prometheus scraping `/metrics` at "
        "the shipped interval, intake + scrapes under 50 % of a core at 16,384 ranks and under 10,000 series per "
        "job.\n",
        "## Method\n",
        "The controller is the real `Controller` (never `run()`): the real `Intake` protocol on a UDP socket on "
        "127.0.0.1 feeds its `Registry`, and a tick loop sleeping `TICK_S` = 0.2 s between ticks, like the "
        "reconcile loop, runs "
        + ("the real `detect()` on that registry. " if args.tick == "detect" else
           "the daemon's own `Controller._tick()` (platform no-op, recovery replaced by a recorder). ")
        + "Its CPU is `getrusage` user + system over the steady window. The baseline, measured in the same run "
        "with the same frames, is an `asyncio.DatagramProtocol` that only counts: the cost of the asyncio UDP "
        "transport itself. Load generators send frames encoded beforehand with `supervisor.protocol.encode` "
        "(valid MAC, the worker SDK's fields, a new `seq` and step every beat), paced in ~2 ms batches so each "
        "rank beats once per interval at its own offset. Inside the window a random set of ranks stops beating "
        "at random times; the generator notes when each one's last heartbeat left, the controller when "
        "`detect()` first names it `dead`; the lag column is detected - last sent - timeout (0 is the best "
        "possible; a tick every 0.2 s adds up to about 0.2 s to it). Dropped = frames sent minus "
        "frames the controller handled; in brackets the kernel's own count (`/proc/net/udp` drops) for the "
        "intake socket.\n",
        "## Results\n",
        main_table + "\n",
        "Medians over rounds; dropped, sent and detections are totals. CPU µs per heartbeat is the "
        "controller's CPU over the heartbeats it handled in the window, ticks included; CPU % at the offered "
        "rate is that times the rate sent (an upper bound where heartbeats were dropped: tick costs do not "
        "grow with it), and the CPU target is judged on the larger of the two. Host busy is the "
        "share of all the host's CPUs in use during the window, other tenants included; waiting for a CPU is "
        "the time the controller was runnable but not running (`/proc/self/schedstat`), as a share of the "
        "window: the part of the window a busy host took from it.\n",
    ]
    if read:
        parts += ["Reading:\n", "".join(f"- {line}\n" for line in read)]
    if full_table:
        parts += [
            "### The incremental tick against the full pass\n",
            "The same controller, the same traffic, in this run: once as shipped (the registry indexes each "
            "rank's next deadline as its heartbeats arrive, and `detect()` answers at once while none has "
            "come), once with `detect()` replaced by `detect_full()`, which visits every rank on every tick "
            "(every tick before issue 28). Each `detect()` call is timed on its own, and the whole tick around "
            "it (wall time: with `--tick full` it includes the heartbeats the loop reads while the tick awaits "
            "the platform). Ticks that found nothing are those of a healthy gang; once a killed rank is found "
            "dead, every tick finds it again (the recorder stands in for the recovery that would reset the "
            "registry) and both configurations make the full pass. Ratio = full pass / incremental.\n",
            full_table + "\n",
        ]
    if scrape_table:
        parts += [
            "### /metrics under Prometheus-style scrapes\n",
            f"The third configuration of each size: the same controller also serves the real `/metrics` app "
            f"(`supervisor.controller.http.build_app`), and a scraper process GETs it every {args.scrape_interval:g} s "
            f"with `Accept-Encoding: gzip` and a {args.scrape_timeout:g} s timeout (the shipped "
            "`deploy/prometheus/prometheus.yml`), from before the window to its end. Each scrape takes a snapshot "
            "of the controller's state on the event loop and renders it (aggregates, text, gzip) in a worker "
            "thread; the controller's CPU column counts every thread. Render = snapshot to bytes, in the run "
            "(wall, and the worker thread's CPU), and alone on the run's final registry after the window (best of "
            "3). A gang above ~16,000 ranks has a rendering served again to the scrapes that follow while it is "
            "younger than `decide.metrics_every_s` (at 131,072 ranks 4 s, or longer where renderings cost more "
            "than 2 % of a core: 7 s for 0.14 s of CPU) and the job's phase and attempt are "
            "unchanged: renderings counts the ones made in the window, and the render columns are theirs. "
            "Series = samples in one scrape. The scrape cost is the CPU of this configuration minus the "
            "intake-only one, both in this run (noise on a shared host can make it negative).\n",
            scrape_table + "\n",
        ]
    parts += ["Every run:\n", runs_table + "\n"]
    if cost_table:
        parts += [
            "### Where the controller's time goes\n",
            "Each step of the intake path timed on its own, in one process (CPU time, best of 5 passes over "
            "30,000 of the run's frames after one beat of every rank), priced at ranks x rate heartbeats a "
            "second. The in-run total is higher than the sum: in the run, caches are shared with the "
            "generator and whatever else the host runs.\n",
            cost_table + "\n",
        ]
    if tick_table:
        parts += [
            "### What each piece of the daemon's reconcile tick costs\n",
            "Measured after the window on the run's final registry (every rank, up to 20 step times each), "
            "best of 3, and priced at the rate the daemon's `Controller._tick()` calls each piece. "
            "`straggler_scores` is timed on the first 1,024 and 2,048 ranks and, when that growth predicts more "
            "than 3 s at full size, extrapolated instead of run. `--tick detect` runs only `detect()` every "
            "tick; `--tick full` runs `Controller._tick()` itself.\n",
            tick_table + "\n",
        ]
    parts += [
        "## Notes\n",
        f"- The machine has {os.cpu_count()} cores shared by the controller, the generators and whatever else "
        "runs on the host: the generators' own CPU is in its column, and the kernel's loopback delivery "
        "(queueing each datagram on the receiver's socket) is charged to the sender's `sendto`, not to the "
        "controller. On a real cluster the frames come from the NIC and that softirq work lands on the "
        "controller's host instead.\n",
        "- The ratio vs baseline is the controller's CPU over the bare asyncio UDP counter's, both measured in "
        "this run with identical traffic, so host noise that hits both cancels out.\n",
        "- SO_RCVBUF is what `getsockopt` reports once the socket is set up as `Controller.run()` sets it up "
        "(the baseline's socket too; Linux reports twice the size asked for and, without "
        "CAP_NET_ADMIN, caps it at `net.core.rmem_max`).\n",
    ]
    parts += [f"- {n}\n" for n in notes]
    if profiles:
        for ranks, text in profiles.items():
            parts += [f"\n### cProfile of the controller over the window, {ranks:,} ranks (profiler on)\n",
                      "```\n" + text.strip() + "\n```\n"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(parts))


def scrape_summary(rs: list[dict], o_cpu: float, b_cpu: float, args) -> dict[str, Any]:
    scrapes = [x for r in rs for x in r["scrapes"]]
    renders = [x for r in rs for x in r["renders"]]
    shapes = [r["scrape_shape"] for r in rs if r["scrape_shape"]]
    cpu = statistics.median(x["cpu_pct"] for x in rs)
    return {
        "scrapes_n": len(scrapes), "scrapes_failed": sum(1 for x in scrapes if x.get("status") != 200),
        "renders_n": len(renders),
        "scrape_lat_p50_ms": 1e3 * pct([x["latency_s"] for x in scrapes], .5),
        "scrape_lat_max_ms": 1e3 * max((x["latency_s"] for x in scrapes), default=float("nan")),
        "render_p50_ms": 1e3 * pct([x[1] for x in renders], .5),
        "render_max_ms": 1e3 * max((x[1] for x in renders), default=float("nan")),
        "render_cpu_p50_ms": 1e3 * pct([x[2] for x in renders], .5),
        "render_alone_ms": 1e3 * min((s["alone_s"] for s in shapes), default=float("nan")),
        "scrape_bytes": statistics.median([x[3] for x in renders] or [0]),
        "scrape_plain_bytes": statistics.median([x[4] for x in renders] or [0]),
        "series": max((s["series"] for s in shapes), default=0),
        "cpu_intake_only": o_cpu, "scrape_cost_pct": cpu - o_cpu,
        "ratio_intake_only": o_cpu / b_cpu if b_cpu else float("nan"),
    }


def render_scrapes(rows: list[dict], args) -> str:
    scraped = [r for r in rows if r["mode"] == "scrape"]
    if not scraped:
        return ""
    lines = ["| ranks | scrapes in the window (failed) | renderings | scrape latency p50 / max (ms) | render in the run p50 / max "
             "(ms, wall) | render CPU p50 (ms) | render alone (ms) | bytes per scrape gzip / plain | series per job | "
             "controller CPU % intake only -> with scrapes (ratio vs baseline) | scrape cost (% of a core) | "
             "targets: CPU < 50 %, series < 10,000 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(scraped, key=lambda r: r["ranks"]):
        cpu_ok = max(r["cpu"], r["cpu_full"]) < CPU_TARGET_PCT
        series_ok = r["series"] < SERIES_TARGET
        lines.append(
            f"| {r['ranks']:,} | {r['scrapes_n']} ({r['scrapes_failed']}) | {r['renders_n']} | "
            f"{r['scrape_lat_p50_ms']:.1f} / "
            f"{r['scrape_lat_max_ms']:.1f} | {r['render_p50_ms']:.1f} / {r['render_max_ms']:.1f} | "
            f"{r['render_cpu_p50_ms']:.1f} | {r['render_alone_ms']:.1f} | {r['scrape_bytes']:,.0f} / "
            f"{r['scrape_plain_bytes']:,.0f} | {r['series']:,} | {r['cpu_intake_only']:.1f} "
            f"({r['ratio_intake_only']:.2f}x) -> {r['cpu']:.1f} ({r['ratio']:.2f}x) | {r['scrape_cost_pct']:+.1f} | "
            f"CPU {'PASS' if cpu_ok else 'MISS'}, series {'PASS' if series_ok else 'MISS'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
