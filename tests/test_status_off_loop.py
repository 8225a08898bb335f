"""``/status`` is served like ``/metrics`` (issue 24, item 3): a snapshot on the event loop at
most once a second, the document rendered and encoded in a worker thread, per-rank detail
capped (the stalest and the slowest ranks, pages through the rest), so that a flood of requests
at any job size never holds the loop that takes the heartbeats."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import aiohttp
import pytest

from helpers import no_platform
from supervisor import cli
from supervisor.config import from_dict
from supervisor.controller import view
from supervisor.controller.daemon import Controller
from supervisor.controller.view import STATUS_PAGE_MAX, STATUS_WORST_RANKS
from supervisor.controller.http import STATUS, start_http
from supervisor.protocol import Heartbeat

WORLD = 2000


def big_controller(tmp_path, world=WORLD) -> Controller:
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "logs"),
                     "checkpoint_dir": str(tmp_path / "ckpt"), "heartbeat": {"timeout_s": 5.0}})
    c = Controller(cfg, no_platform())
    c.wire.token = b"t" * 48
    c.registry.reset(0, world)
    now = c.clock()
    for r in range(world):
        # ranks 7, 77, ... fell silent long ago (the stalest); the rest beat just now
        received = now - 60 - r if r % 70 == 7 else now
        c.registry.observe(Heartbeat(job="j", attempt=0, rank=r, world_size=world, seq=1, step=100 + r % 5,
                                     phase="compute", phase_s=0.1, node=f"node{r // 8}"), received)
    c.detection = replace(c.detection, stragglers={r: 1.0 + (3.0 if r % 100 == 3 else 0.0) + r / 1e6
                                                   for r in range(world)})
    return c


def serve(c: Controller, body):
    async def main():
        runner = await start_http(c, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{c.http_port}") as session:
                return await body(session, runner.app)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_status_is_rendered_in_a_worker_thread_while_the_loop_keeps_answering(tmp_path, monkeypatch):
    c = big_controller(tmp_path)
    entered, release = threading.Event(), threading.Event()
    rendered_in: list[threading.Thread] = []
    real = view.status_json

    def slow_render(snap, **kw):  # a render that takes as long as the test says
        rendered_in.append(threading.current_thread())
        entered.set()
        assert release.wait(20)
        return real(snap, **kw)

    monkeypatch.setattr(view, "status_json", slow_render)

    async def body(session, app):
        loop_thread = threading.current_thread()
        pending = asyncio.ensure_future(session.get("/status"))
        assert await asyncio.to_thread(entered.wait, 10), "the render never started"
        answered = 0
        for _ in range(20):  # the loop answers while the render holds its thread
            async with session.get("/healthz") as resp:
                assert resp.status == 200
                answered += 1
        assert not pending.done()
        release.set()
        async with await pending as resp:
            assert resp.status == 200
            st = await resp.json()
        return loop_thread, answered, st

    loop_thread, answered, st = serve(c, body)
    assert answered == 20 and st["world_size"] == WORLD
    assert rendered_in and all(t is not loop_thread for t in rendered_in)
    assert rendered_in[0].name.startswith("status-render")


def test_a_flood_of_requests_shares_one_snapshot_a_second(tmp_path):
    c = big_controller(tmp_path)

    async def body(session, app):
        async def get():
            async with session.get("/status") as resp:
                return (await resp.json())["as_of_unix"]

        first = await asyncio.gather(*(get() for _ in range(40)))
        taken_first = app[STATUS].snapshots
        await asyncio.sleep(1.1)
        later = await get()
        return first, taken_first, later, app[STATUS].snapshots

    first, taken_first, later, taken = serve(c, body)
    assert taken_first == 1 and len(set(first)) == 1  # 40 requests, one snapshot
    assert taken == 2 and later > first[0]  # a second later: a new one


def test_per_rank_detail_is_capped_to_the_stalest_and_slowest_with_the_rest_summarised(tmp_path):
    c = big_controller(tmp_path)
    st = c.status()
    listed = {r["rank"] for r in st["ranks"]}
    stalest = sorted((r for r in range(WORLD) if r % 70 == 7), reverse=True)[:STATUS_WORST_RANKS]
    slowest = sorted((r for r in range(WORLD) if r % 100 == 3), reverse=True)[:STATUS_WORST_RANKS]
    assert listed == set(stalest) | set(slowest)
    s = st["ranks_summary"]
    assert s["heard"] == WORLD and s["listed"] == len(listed) and s["omitted"] == WORLD - len(listed)
    assert s["selection"] == "stalest_and_slowest" and s["by_phase"] == {"compute": WORLD}
    assert s["stale"] == len([r for r in range(WORLD) if r % 70 == 7]) and s["stragglers"] == WORLD // 100
    assert s["step_min"] == 100 and s["step_max"] == 104
    assert st["alive_ranks"] == WORLD - s["stale"]
    text = cli.render_status(st)
    assert f"{s['omitted']} of {WORLD} ranks not listed" in text and "--ranks-from 0" in text


def test_pages_walk_every_rank_in_order(tmp_path):
    c = big_controller(tmp_path)

    async def body(session, app):
        out = {}
        for q in ("offset=100&limit=50", "offset=1990", f"limit={10 * STATUS_PAGE_MAX}", "offset=-1", "limit=x"):
            async with session.get(f"/status?{q}") as resp:
                out[q] = (resp.status, await resp.json())
        return out

    got = serve(c, body)
    status, page = got["offset=100&limit=50"]
    assert status == 200 and [r["rank"] for r in page["ranks"]] == list(range(100, 150))
    assert page["ranks_summary"]["next_offset"] == 150 and page["ranks_summary"]["omitted"] == WORLD - 50
    status, tail = got["offset=1990"]
    assert [r["rank"] for r in tail["ranks"]] == list(range(1990, 2000)) and tail["ranks_summary"]["next_offset"] is None
    assert len(got[f"limit={10 * STATUS_PAGE_MAX}"][1]["ranks"]) == STATUS_PAGE_MAX
    assert got["offset=-1"][0] == 400 and got["limit=x"][0] == 400
    text = cli.render_status(page)
    assert "next page: --ranks-from 150" in text


@pytest.mark.parametrize("world", [3])
def test_a_small_job_lists_every_rank(tmp_path, world):
    st = big_controller(tmp_path, world).status()
    assert [r["rank"] for r in st["ranks"]] == [0, 1, 2] and st["ranks_summary"]["omitted"] == 0
    assert "not listed" not in cli.render_status(st)
