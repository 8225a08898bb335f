"""The controller's intake, metrics and status on a fake platform (no processes)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from helpers import view_registry
from supervisor.config import from_dict
from supervisor.controller.daemon import Controller
from supervisor.controller.intake import Intake
from supervisor.controller.decide import RestartTimer
from supervisor.controller.view import JobView, render_status
from supervisor.health import Registry
from supervisor.platforms.base import LaunchSpec, NodeState, NodeStatus, Platform, PlatformError
from supervisor.protocol import Heartbeat, control_message, decode_control, derive_keys, encode, encode_node_frames


class FakePlatform(Platform):
    """Obeys the Platform contract in memory: nodes run until killed or torn down."""

    kind = "fake"

    def __init__(self, slots=3):
        self._slots = [f"node{i}" for i in range(slots)]
        self.nodes: dict[str, NodeStatus] = {}
        self.calls: list[tuple] = []

    async def launch(self, spec: LaunchSpec) -> None:
        self.calls.append(("launch", spec.attempt, tuple(spec.nodes)))
        self.nodes = {n: NodeStatus(n, spec.attempt, NodeState.RUNNING) for n in spec.nodes}

    async def observe(self):
        return dict(self.nodes)

    async def kill_node(self, name: str) -> None:
        self.calls.append(("kill_node", name))
        n = self.nodes[name]
        self.nodes[name] = NodeStatus(name, n.attempt, NodeState.EXITED, -9, killed_by_us=True)

    async def teardown(self, grace_s: float) -> None:
        self.calls.append(("teardown",))
        for name, n in self.nodes.items():
            if n.state == NodeState.RUNNING:
                self.nodes[name] = NodeStatus(name, n.attempt, NodeState.EXITED, -15, killed_by_us=True)

    def slots(self):
        return list(self._slots)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


TOKEN = b"tok"
KEYS = derive_keys(TOKEN)
LAUNCH = "5" * 32


def controller(tmp_path):
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "nodes": {"min": 1, "max": 2},
                     "log_dir": str(tmp_path / "logs"), "checkpoint_dir": str(tmp_path / "ckpt")})
    clock = Clock()
    c = Controller(cfg, FakePlatform(), clock=clock)
    c.wire.token = TOKEN
    c.launch_id = LAUNCH  # the running gang's launch
    c.wire.launch_ids.append(LAUNCH)
    c.attempt = 2
    c.registry.reset(2, 2)
    (tmp_path / "logs").mkdir()
    return c, clock


def hb(rank, **kw):
    base = dict(job="j", attempt=2, rank=rank, world_size=2, seq=kw.pop("seq", 1), step=5, phase="compute",
                phase_s=0.1, node=f"node{rank}", launch=LAUNCH)
    return Heartbeat(**(base | kw))


def test_intake_accepts_authenticated_current_attempt_only(tmp_path):
    c, clock = controller(tmp_path)
    intake = Intake(c)
    intake.datagram_received(encode(hb(0).to_payload(), KEYS.heartbeat), ("127.0.0.1", 5000))
    intake.datagram_received(encode(hb(1, attempt=1).to_payload(), KEYS.heartbeat), ("127.0.0.1", 5001))
    intake.datagram_received(encode(hb(1, job="other").to_payload(), KEYS.heartbeat), ("127.0.0.1", 5001))
    intake.datagram_received(encode(hb(1).to_payload(), b"bad"), ("127.0.0.1", 5001))
    intake.datagram_received(b"\x00" * 10, ("127.0.0.1", 5001))
    intake.datagram_received(encode(hb(3, world_size=4).to_payload(), KEYS.heartbeat), ("127.0.0.1", 5001))
    assert set(c.registry.ranks) == {0} and c.wire.received == 1 and c.registry.addresses() == {0: ("127.0.0.1", 5000)}
    assert c.wire.rejected == {"stale_attempt": 2, "unauthenticated": 1, "malformed": 1, "schema": 1}


def test_a_node_frame_moves_its_ranks_reply_addresses_to_the_relay_and_a_replay_moves_none(tmp_path):
    c, clock = controller(tmp_path)
    intake = Intake(c)
    relay = ("10.0.0.7", 41000)
    (frame,) = encode_node_frames([(hb(0, seq=3), 0.2), (hb(1, seq=3), 0.1)], KEYS.heartbeat)
    intake.datagram_received(frame, relay)
    assert c.registry.addresses() == {0: relay, 1: relay} and c.wire.node_frames == 1
    assert [c.registry.ranks[r].received for r in (0, 1)] == pytest.approx([clock.t - 0.2, clock.t - 0.1])
    intake.datagram_received(frame, ("10.9.9.9", 6666))  # the same frame, replayed from elsewhere
    assert c.registry.addresses() == {0: relay, 1: relay} and [c.registry.ranks[r].hb.seq for r in (0, 1)] == [3, 3]
    # a frame of a later launch's rank is fenced one heartbeat at a time: rank 1's address stays
    (mixed,) = encode_node_frames([(hb(0, seq=4), 0.0), (hb(1, seq=4, launch="e" * 32), 0.0)], KEYS.heartbeat)
    intake.datagram_received(mixed, ("10.0.0.8", 41000))
    assert c.registry.addresses() == {0: ("10.0.0.8", 41000), 1: relay}
    assert c.wire.rejected == {"other_launch": 1}


def test_a_replayed_heartbeat_does_not_move_a_ranks_reply_address(tmp_path):
    c, _ = controller(tmp_path)
    intake = Intake(c)
    captured = encode(hb(0, seq=3).to_payload(), KEYS.heartbeat)
    intake.datagram_received(captured, ("127.0.0.1", 5000))
    intake.datagram_received(encode(hb(0, seq=4).to_payload(), KEYS.heartbeat), ("127.0.0.1", 5000))
    intake.datagram_received(captured, ("10.9.9.9", 6666))  # the attacker replays it from elsewhere
    assert c.registry.addresses() == {0: ("127.0.0.1", 5000)} and c.registry.ranks[0].hb.seq == 4


def test_a_heartbeat_of_another_launch_is_refused_by_reason_and_changes_nothing(tmp_path):
    c, _ = controller(tmp_path)
    intake = Intake(c)
    intake.datagram_received(encode(hb(0, seq=3).to_payload(), KEYS.heartbeat), ("127.0.0.1", 5000))
    earlier, foreign = "e" * 32, "f" * 32
    c.wire.launch_ids.appendleft(earlier)  # an earlier launch of this run
    # the same job, attempt, rank and token, a higher seq, another pid, another step: what a heartbeat
    # captured in another run (a token reused) or in an earlier launch looks like, replayed
    for launch in (earlier, foreign):
        replay = hb(0, seq=10**9, step=10**6, pid=4242, phase="done", launch=launch)
        intake.datagram_received(encode(replay.to_payload(), KEYS.heartbeat), ("10.9.9.9", 6666))
    # the old wire: MAC'd with the token itself, or with the key of the other direction
    intake.datagram_received(encode(hb(0, seq=11).to_payload(), TOKEN), ("10.9.9.9", 6666))
    intake.datagram_received(encode(hb(0, seq=12).to_payload(), KEYS.control), ("10.9.9.9", 6666))
    assert c.wire.rejected == {"stale_attempt": 1, "other_launch": 1, "unauthenticated": 2}
    rec = c.registry.ranks[0].hb
    assert (rec.seq, rec.step, rec.phase, rec.pid) == (3, 5, "compute", 0) and c.wire.received == 1
    assert c.registry.addresses() == {0: ("127.0.0.1", 5000)}


def test_control_frames_go_out_under_the_control_key_stamped_with_the_current_launch(tmp_path):
    import asyncio
    import socket

    c, _ = controller(tmp_path)

    async def main():
        loop = asyncio.get_running_loop()
        transport, intake = await loop.create_datagram_endpoint(lambda: Intake(c), local_addr=("127.0.0.1", 0))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rank:
            rank.bind(("127.0.0.1", 0))
            rank.settimeout(5)
            intake.send(control_message("abort", attempt=2, rank=1, reason="hang", seq=7), rank.getsockname())
            frame = await asyncio.to_thread(rank.recv, 8192)
        transport.close()
        return frame

    frame = asyncio.run(main())
    msg = decode_control(frame, KEYS.control)
    assert (msg.kind, msg.launch, msg.attempt, msg.rank, msg.seq) == ("abort", LAUNCH, 2, 1, 7)
    assert TOKEN not in frame and KEYS.control not in frame and KEYS.heartbeat not in frame


def test_metrics_and_status_render_one_view_of_the_job():
    records = Registry(1, 2)
    records.observe(hb(0, ckpt_s=0.25, attempt=1), 997.5)
    records.observe(hb(1, ckpt_s=0.75, attempt=1), 999.5)
    view = JobView(
        job="j", now=1000.0, unix=1.7e9 + 60, phase="running", attempt=1, world_size=2,
        ranks=list(records.ranks.values()), stragglers={0: 1.0, 1: 2.5}, restarts={"dead": 2},
        timers=[RestartTimer(1, "dead", 900.0, 904.0, 905.0, 905.5, 908.0, 909.0, 909.5)],
        hang_kind="collective_hang", hang_culprits=[(1, "node1")],
        checkpoint={"name": "step-0000000010", "step": 10, "created_unix": 1.7e9, "writer_world_size": 2},
        rejected={"unauthenticated": 3}, excluded_nodes=("node7",), suspect_checkpoints=("step-0000000005",))
    v = view_registry(view).get_sample_value
    assert v("supervisor_job_phase", {"job": "j", "phase": "running"}) == 1.0
    assert v("supervisor_job_phase", {"job": "j", "phase": "recovering"}) == 0.0
    assert v("supervisor_alive_ranks", {"job": "j"}) == 2.0
    assert v("supervisor_rank_heartbeat_age_seconds", {"job": "j", "rank": "0"}) == 2.5
    assert v("supervisor_straggler_score", {"job": "j", "rank": "1"}) == 2.5
    assert v("supervisor_hang_detected", {"job": "j", "kind": "collective_hang", "rank": "1", "node": "node1"}) == 1.0
    assert v("supervisor_restarts_total", {"job": "j", "reason": "dead"}) == 2.0
    assert v("supervisor_restart_phase_seconds_sum", {"job": "j", "phase": "detect"}) == 4.0
    assert v("supervisor_restart_phase_seconds_bucket", {"job": "j", "phase": "detect", "le": "5.0"}) == 1.0
    assert v("supervisor_restart_phase_seconds_bucket", {"job": "j", "phase": "detect", "le": "2.0"}) == 0.0
    assert v("supervisor_last_checkpoint_step", {"job": "j"}) == 10.0
    assert v("supervisor_checkpoint_save_seconds", {"job": "j"}) == 0.75
    assert v("supervisor_heartbeats_rejected_total", {"job": "j", "reason": "unauthenticated"}) == 3.0
    assert v("supervisor_heartbeats_rejected_total", {"job": "j", "reason": "oversized"}) == 0.0
    assert v("supervisor_excluded_nodes", {"job": "j"}) == 1.0
    # the same view, ten seconds on: both ranks silent past the 5 s timeout
    later = dataclasses.replace(view, now=1010.0)
    assert view_registry(later).get_sample_value("supervisor_alive_ranks", {"job": "j"}) == 0.0
    st = render_status(later)
    assert st["alive_ranks"] == 0 and st["ranks_summary"]["stale"] == 2
    assert st["excluded_nodes"] == ["node7"] and st["suspect_checkpoints"] == ["step-0000000005"]
    assert st["last_checkpoint"]["age_s"] == 60.0 and st["restarts"][0]["reason"] == "dead"
    if shutil.which("promtool"):
        text = generate_latest(view_registry(view))
        proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_controllers_view_is_its_state(tmp_path):
    c, clock = controller(tmp_path)
    c.registry.observe(hb(0), clock.t - 1.0)
    view = c.view()
    assert (view.job, view.attempt, view.phase, view.world_size) == ("j", 2, "starting", 2)
    assert view.run == c.state.run and view.checkpoint_root == c.state.ckpt_root and view.exit_code is None
    assert [r.hb.rank for r in view.ranks] == [0] and view.budget_remaining_s == 900.0


def test_status_is_json_ready(tmp_path):
    import json

    c, clock = controller(tmp_path)
    c.registry.observe(hb(0, watchdog="compute running 9s"), clock.t)
    st = c.status()
    json.dumps(st)
    assert st["job"] == "j" and st["attempt"] == 2 and st["ranks"][0]["watchdog"] == "compute running 9s"
    assert st["budget_remaining_s"] == 900.0



def test_a_burst_of_heartbeats_on_the_real_socket_is_taken_whole_and_judged_one_by_one(tmp_path):
    # the intake reads everything queued when it wakes (not one datagram per loop iteration):
    # every heartbeat of a burst is still authenticated and fenced on its own
    import asyncio
    import socket

    from supervisor.controller.intake import DRAIN_MAX
    from supervisor.protocol import MAX_DATAGRAM

    c, _ = controller(tmp_path)
    n = DRAIN_MAX + 40  # more than one wake-up's worth

    async def main():
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: Intake(c), local_addr=("127.0.0.1", 0))
        port = transport.get_extra_info("sockname")[1]
        rx = transport.get_extra_info("socket")
        try:  # room for the whole burst (the daemon grows its buffer the same way: SO_RCVBUFFORCE as root)
            rx.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)
        except OSError:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for i in range(n):
                tx.sendto(encode(hb(i % 2, seq=i + 1).to_payload(), KEYS.heartbeat), ("127.0.0.1", port))
            tx.sendto(b"\x00" * 10, ("127.0.0.1", port))                                  # garbage mid-burst
            tx.sendto(encode(hb(1, attempt=1).to_payload(), KEYS.heartbeat), ("127.0.0.1", port))  # an old attempt
            tx.sendto(b"{" * (MAX_DATAGRAM + 100), ("127.0.0.1", port))                   # read cut, still oversized
            tx.sendto(encode(hb(0, seq=n + 1).to_payload(), KEYS.heartbeat), ("127.0.0.1", port))
            deadline = loop.time() + 10
            while c.wire.received < n + 1 and loop.time() < deadline:
                await asyncio.sleep(0.01)
            # after the burst the intake pauses (coalescing) and then watches the socket again
            tx.sendto(encode(hb(1, seq=n + 2).to_payload(), KEYS.heartbeat), ("127.0.0.1", port))
            while c.wire.received < n + 2 and loop.time() < deadline:
                await asyncio.sleep(0.01)
        transport.close()

    asyncio.run(main())
    assert c.wire.received == n + 2
    assert c.wire.rejected == {"malformed": 1, "stale_attempt": 1, "oversized": 1}
    assert c.registry.ranks[0].hb.seq == n + 1 and c.registry.ranks[1].hb.seq == n + 2
    assert set(c.registry.ranks) == {0, 1}


# ------------------------------------------------------------------ a launch is the loop's task
class SlowPlatform(FakePlatform):
    """A launch that waits until ``placed`` is set (pods waiting for a node), or fails with ``refuse``."""

    def __init__(self, refuse: str = ""):
        super().__init__()
        self.placed = None
        self.refuse = refuse

    async def launch(self, spec: LaunchSpec) -> None:
        if self.refuse:
            raise PlatformError(self.refuse)
        self.placed = self.placed or asyncio.Event()
        await self.placed.wait()
        await super().launch(spec)


def slow_controller(tmp_path, platform):
    tmp_path.mkdir(parents=True, exist_ok=True)
    c, _ = controller(tmp_path)
    c.platform = platform
    return c


def names(c):
    path = c.log_dir / "events.jsonl"
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_launch_under_way_is_a_task_whose_end_is_the_next_look(tmp_path):
    platform = SlowPlatform()
    c = slow_controller(tmp_path, platform)

    async def story():
        c.executor.start_launch(c.executor.launch(["node0"], None))
        for _ in range(20):  # the loop's looks meanwhile: the launch is not over
            await asyncio.sleep(0)
            assert not c.executor.launch_settled()
        assert "launched" not in names(c) and not c.signals.wake.is_set()
        platform.placed.set()
        await asyncio.wait_for(c.signals.wake.wait(), 5)  # its end wakes the loop
        assert c.executor.launch_settled() and c.executor.launching is None

    asyncio.run(story())
    assert names(c)[-1] == "launched" and c.phase.value == "starting"
    assert platform.calls == [("launch", 2, ("node0",))]


def test_a_hand_off_abandons_the_launch_under_way_and_a_stop_lets_it_end(tmp_path):
    handed = SlowPlatform()
    c = slow_controller(tmp_path / "a", handed)

    async def hand_off():
        c.executor.start_launch(c.executor.launch(["node0"], None))
        await asyncio.sleep(0)
        await asyncio.wait_for(c.executor.settle_launch(abandon=True), 5)

    asyncio.run(hand_off())
    assert names(c) == ["launch_abandoned"] and handed.calls == []

    stopped = SlowPlatform()
    s = slow_controller(tmp_path / "b", stopped)

    async def stop():
        s.executor.start_launch(s.executor.launch(["node1"], None))
        await asyncio.sleep(0)
        settling = asyncio.ensure_future(s.executor.settle_launch(abandon=False))
        for _ in range(20):  # the launch cannot end before its pods are placed: nor can the stop's wait
            await asyncio.sleep(0)
        assert not settling.done()  # the stop waits for the launch: its teardown must find every pod
        stopped.placed.set()
        await asyncio.wait_for(settling, 5)

    asyncio.run(stop())
    assert names(s)[-1] == "launched" and stopped.calls == [("launch", 2, ("node1",))]


def test_a_first_launchs_platform_error_is_raised_at_the_look_that_takes_it_in(tmp_path):
    c = slow_controller(tmp_path, SlowPlatform(refuse="admission webhook denied the pod"))

    async def story():
        c.executor.start_launch(c.executor.launch(["node0"], None))
        await asyncio.wait_for(c.signals.wake.wait(), 5)
        with pytest.raises(PlatformError, match="admission webhook denied"):
            c.executor.launch_settled()
        assert c.executor.launch_settled()  # taken in once

    asyncio.run(story())
