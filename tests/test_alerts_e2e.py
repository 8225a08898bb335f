"""End to end with the real servers on loopback: supervisor -> Prometheus -> Alertmanager -> receivers.

The supervisor runs the example job (2 nodes) with a hang injected into rank 1 at step 40;
a real Prometheus (Debian 2.42) scrapes it every second and evaluates
``deploy/prometheus/rules/supervisor-alerts.yml``; a real Alertmanager (0.25) runs
``deploy/alertmanager/alertmanager.yml``; the receivers are a real aiohttp server in this
test, standing in for the paging webhook and the PagerDuty Events API v2. Only timing
(1 s intervals instead of 15 s / 10 s) and endpoints (loopback instead of the placeholder
URLs) differ from the example configurations; routes, matchers, inhibitions, templates and
rules are the shipped ones.

What is checked: the page names the job, the culprit rank, its node and the fault kind; it resolves
after the supervisor has recovered the job (while the job is still running, so not because
the supervisor went away); the fault -> page time is measured. The same Prometheus then runs
every dashboard query, and ``promtool check metrics`` reads a real scrape (gzipped, as
Prometheus asks for it).

A second test gives Alertmanager alerts directly to check grouping by job and inhibition.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from conftest import REPO, SupervisorRun, kill_leftovers
from test_alerts import dashboard_queries, exported_names, metric_names

PROM_DIR = REPO / "deploy" / "prometheus"
AM_DIR = REPO / "deploy" / "alertmanager"
JOB = "e2e-hang"
FAULT = "kind=hang,rank=1,step=40,attempt=0"
JOB_ARGS = ["--steps", "200", "--checkpoint-every", "10", "--step-sleep", "0.05"]

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PROMTOOL = shutil.which("promtool")

needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="prometheus/promtool not installed (scripts/install-prometheus.sh installs them)")
needs_alertmanager = pytest.mark.skipif(
    ALERTMANAGER is None,
    reason="alertmanager not installed (scripts/install-prometheus.sh installs prometheus-alertmanager)")


# ---------------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, data: bytes | None = None, timeout: float = 5.0):
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_until(predicate, timeout: float, what: str, diagnostics=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnostics()}")


@dataclass
class Post:
    at: float  # wall clock when it arrived
    path: str
    body: dict


class Receiver:
    """A real HTTP server (aiohttp, own thread and loop) taking Alertmanager's webhook posts
    (``/webhook/<receiver>``) and PagerDuty Events API v2 posts (``/pagerduty``)."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="alert-receiver", daemon=True)
        self.port = 0

    def start(self) -> "Receiver":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("receiver did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def webhook(request: web.Request) -> web.Response:
            self._record(request.path, await request.json())
            return web.json_response({"ok": True})

        async def pagerduty(request: web.Request) -> web.Response:
            body = await request.json()
            self._record(request.path, body)
            return web.json_response({"status": "success", "message": "Event processed",
                                      "dedup_key": body.get("dedup_key", "")}, status=202)

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/webhook/{name}", webhook)
            app.router.add_post("/pagerduty", pagerduty)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            return runner

        self._runner = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def _record(self, path: str, body: dict) -> None:
        with self._lock:
            self.posts.append(Post(time.time(), path, body))

    def received(self, path: str) -> list[Post]:
        with self._lock:
            return [p for p in self.posts if p.path == path]

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class Server:
    """A real server process in its own session, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, name: str, cmd: list[str], log: Path, ready_url: str) -> None:
        self.name, self.log, self.ready_url = name, log, ready_url
        self._out = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 30) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited rc={self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_until(ready, timeout, f"{self.name} ready", self.output)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def alertmanager_config(receiver: Receiver, key_file: Path) -> dict:
    """The shipped example with loopback endpoints and 1 s timing; nothing else changed."""
    cfg = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())
    cfg["templates"] = [str(AM_DIR / t) for t in cfg["templates"]]
    cfg["route"]["group_wait"] = "1s"  # sub-routes inherit it unless they set their own (Watchdog: 0s)
    for route in [cfg["route"], *cfg["route"].get("routes", [])]:
        route["group_interval"] = "1s"
        route["repeat_interval"] = "1h"
    for rcv in cfg["receivers"]:
        for hook in rcv.get("webhook_configs", []):
            hook["url"] = f"{receiver.url}/webhook/{rcv['name']}"
        for pd in rcv.get("pagerduty_configs", []):
            pd["routing_key_file"] = str(key_file)
            pd["url"] = f"{receiver.url}/pagerduty"
    return cfg


def start_alertmanager(tmp: Path, receiver: Receiver) -> tuple[Server, int]:
    key = tmp / "pagerduty-routing-key"
    key.write_text("R0UT1NGKEY0000000000000000000000\n")
    conf = tmp / "alertmanager.yml"
    conf.write_text(yaml.safe_dump(alertmanager_config(receiver, key)))
    port = free_port()
    server = Server("alertmanager", [ALERTMANAGER, f"--config.file={conf}", f"--storage.path={tmp / 'am-data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                                     "--log.level=info"],
                    tmp / "alertmanager.log", f"http://127.0.0.1:{port}/-/ready")
    return server, port


def start_prometheus(tmp: Path, am_port: int, sv_port: int, prom_port: int) -> Server:
    """The shipped prometheus.yml and rules, scraping the supervisor at ``sv_port`` every second."""
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str(PROM_DIR / f) for f in cfg["rule_files"]]
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{am_port}"]
    (scrape,) = [s for s in cfg["scrape_configs"] if s["job_name"] == "elastic-supervisor"]
    scrape.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [f"127.0.0.1:{sv_port}"]}])
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    return Server("prometheus", [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'prom-data'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
                                 # Prometheus learns its Alertmanager ~5 s after start and drops
                                 # what fired before; resend each second (the default is 1m)
                                 "--rules.alert.resend-delay=1s"],
                  tmp / "prometheus.log", f"http://127.0.0.1:{prom_port}/-/ready")


@dataclass
class Stack:
    """A running Alertmanager (to ``receiver``) and Prometheus (the shipped rules, scraping the
    supervisor at ``sv_port``), and the supervisor run the caller starts (``run``)."""

    receiver: Receiver
    sv_port: int
    prom_port: int
    run: SupervisorRun | None = None


@contextmanager
def alert_stack(tmp: Path):
    """:class:`Stack`, both servers ready; on the way out the run (and what its gang left) is
    killed and the servers stopped, whatever happened."""
    receiver = Receiver().start()
    servers: list[Server] = []
    st = None
    try:
        am, am_port = start_alertmanager(tmp, receiver)
        servers.append(am)
        sv_port, prom_port = free_port(), free_port()
        servers.append(start_prometheus(tmp, am_port, sv_port, prom_port))
        for server in servers:
            server.wait_ready()
        st = Stack(receiver, sv_port, prom_port)
        yield st
    finally:
        if st is not None and st.run is not None:
            st.run.kill()
            kill_leftovers(st.run.log_dir)
        for server in reversed(servers):
            server.stop()
        receiver.stop()


def post_alerts(am_port: int, alerts: list[dict]) -> None:
    http_json(f"http://127.0.0.1:{am_port}/api/v2/alerts", json.dumps(alerts).encode())


def event_wall_time(event: dict) -> float:
    return datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def alerts_in(post: Post, alertname: str, status: str | None = None) -> list[dict]:
    return [a for a in post.body.get("alerts", [])
            if a["labels"].get("alertname") == alertname and (status is None or a["status"] == status)]


# ------------------------------------------------------------------------- the hang scenario
@dataclass
class Scenario:
    tmp: Path
    prom_url: str
    receiver: Receiver
    run: SupervisorRun
    started: float
    scrape: str = ""
    fault: dict = field(default_factory=dict)
    restart_complete: dict = field(default_factory=dict)
    page: Post | None = None
    resolved: Post | None = None
    running_after_resolve: bool = False
    timings: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def diagnostics(self) -> str:
        parts = [f"problems: {self.problems}", f"timings: {self.timings}"]
        try:
            parts.append("prometheus alerts: " + json.dumps(http_json(f"{self.prom_url}/api/v1/alerts"))[:2000])
        except OSError as exc:
            parts.append(f"prometheus alerts: {exc}")
        parts.append("receiver posts: " + json.dumps([(p.path, p.body.get("status"),
                                                       [a["labels"].get("alertname") for a in p.body.get("alerts", [])])
                                                      for p in self.receiver.posts])[:2000])
        parts.append("events: " + json.dumps(self.run.events())[:3000])
        parts.append("supervisor output: " + self.run.output()[-2000:])
        return "\n".join(parts)


@pytest.fixture(scope="module")
def hang_scenario(tmp_path_factory):
    if PROMETHEUS is None or PROMTOOL is None or ALERTMANAGER is None:
        pytest.skip("prometheus/promtool/alertmanager not installed (scripts/install-prometheus.sh)")
    tmp = tmp_path_factory.mktemp("alerts-e2e")
    with alert_stack(tmp) as st:
        receiver, sv_port, prom_port = st.receiver, st.sv_port, st.prom_port
        run = st.run = SupervisorRun(tmp, JOB_ARGS, fault=FAULT, extra=["--port", str(sv_port), "--job", JOB])
        sc = Scenario(tmp, f"http://127.0.0.1:{prom_port}", receiver, run, time.time())

        def up() -> bool:
            q = urllib.parse.quote('up{job="elastic-supervisor"} == 1')
            return bool(http_json(f"{sc.prom_url}/api/v1/query?query={q}")["data"]["result"])
        wait_until(up, 60, "Prometheus to scrape the supervisor (up == 1)", sc.diagnostics)

        # a real scrape, taken while the gang is training (every rank labelled series present),
        # asked for gzip as Prometheus asks
        def scrape_with_ranks() -> str:
            req = urllib.request.Request(f"http://127.0.0.1:{sv_port}/metrics", headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.headers.get("Content-Encoding") == "gzip", dict(resp.headers)
                body = gzip.decompress(resp.read()).decode()
            return body if "supervisor_straggler_score{" in body and "supervisor_rank_phase{" in body else ""
        sc.scrape = wait_until(scrape_with_ranks, 60, "a scrape with every rank's series", sc.diagnostics)

        def page():
            for p in receiver.received("/webhook/oncall-page"):
                if alerts_in(p, "SupervisorTrainingHang", "firing"):
                    return p
        sc.page = wait_until(page, 90, "the hang page at the webhook receiver", sc.diagnostics)
        sc.fault = run.wait_event("fault_detected", timeout=5)

        def resolved():
            for p in receiver.received("/webhook/oncall-page"):
                if p.at >= sc.page.at and alerts_in(p, "SupervisorTrainingHang", "resolved"):
                    return p
        sc.resolved = wait_until(resolved, 90, "the hang page to resolve", sc.diagnostics)
        # the job is still running now, so the alert resolved because of the recovery and not
        # because the supervisor (and its metrics) went away
        sc.running_after_resolve = run.proc.poll() is None and not run.events("job_finished")
        done = run.events("restart_complete")
        sc.restart_complete = done[0] if done else {}

        fault_at = event_wall_time(sc.fault) - sc.fault["detection_s"]
        sc.timings = {
            "fault_to_detection_s": round(sc.fault["detection_s"], 2),
            "detection_to_page_s": round(sc.page.at - event_wall_time(sc.fault), 2),
            "fault_to_page_s": round(sc.page.at - fault_at, 2),
        }
        if sc.restart_complete:
            sc.timings["restart_complete_to_resolved_s"] = round(sc.resolved.at - event_wall_time(sc.restart_complete), 2)
            sc.timings["restart_total_s"] = sc.restart_complete["total_s"]
        (tmp / "timings.json").write_text(json.dumps(sc.timings, indent=1))
        print(f"\nalerts e2e timings: {json.dumps(sc.timings)}")
        yield sc


@pytest.mark.slow
def test_hang_page_names_the_job_the_culprit_rank_and_the_fault_kind(hang_scenario):
    sc = hang_scenario
    fault = sc.fault
    assert fault["kind"] == "hang" and fault["ranks"] == [1], fault
    (alert,) = alerts_in(sc.page, "SupervisorTrainingHang", "firing")
    labels = alert["labels"]
    assert labels["job"] == JOB and labels["kind"] == "hang" and labels["severity"] == "page"
    assert "rank" not in labels  # one alert per job, the culprits in its text
    assert sc.page.body["groupLabels"] == {"job": JOB}  # grouped by job
    summary = alert["annotations"]["summary"]
    assert summary.startswith(f"Job {JOB} is hung (hang; culprits: rank 1 on {fault['nodes'][0]});"), summary
    assert "with 1 culprit rank(s)" in alert["annotations"]["description"]
    assert "LOG_DIR/ranks/stacks-rank-R.txt" in alert["annotations"]["description"]
    assert alert["annotations"]["runbook_url"].endswith("docs/runbook.md#training-hang")
    # page latency: detection is bounded by --hang-timeout-floor 3; the rest is scrape (1 s),
    # rule evaluation (1 s) and Alertmanager's group_wait (1 s), with slack for a busy machine
    assert sc.timings["detection_to_page_s"] < 15, sc.timings
    assert sc.timings["fault_to_page_s"] < 25, sc.timings


@pytest.mark.slow
def test_pagerduty_gets_the_same_page_and_its_resolution(hang_scenario):
    sc = hang_scenario
    pd = sc.receiver.received("/pagerduty")
    triggers = [p.body for p in pd if p.body.get("event_action") == "trigger"
                and "is hung (hang;" in p.body["payload"]["summary"]]
    assert triggers, [p.body for p in pd]
    trig = triggers[0]
    assert trig["routing_key"] == "R0UT1NGKEY0000000000000000000000"
    assert trig["payload"]["severity"] == "critical" and trig["payload"]["group"] == JOB
    assert f"Job {JOB} is hung (hang; culprits: rank 1 on " in trig["payload"]["summary"]
    assert "kind=hang" in trig["payload"]["custom_details"]["alerts"]
    assert trig["links"][0]["href"].endswith("#training-hang")
    assert any(p.body.get("event_action") == "resolve" and p.body["dedup_key"] == trig["dedup_key"] for p in pd), \
        [p.body.get("event_action") for p in pd]


@pytest.mark.slow
def test_page_resolves_after_the_supervisor_recovers_the_job(hang_scenario):
    sc = hang_scenario
    assert sc.restart_complete, "no restart_complete event before the alert resolved"
    assert sc.restart_complete["reason"] == "hang" and sc.restart_complete["attempt"] == 1
    # resolved only once the relaunched gang took its first step ...
    assert sc.resolved.at >= event_wall_time(sc.restart_complete) - 0.5, sc.timings
    # ... and while the job was still running (not because the supervisor exited)
    assert sc.running_after_resolve
    assert sc.timings["restart_complete_to_resolved_s"] < 15, sc.timings
    (alert,) = alerts_in(sc.resolved, "SupervisorTrainingHang", "resolved")
    assert alert["labels"]["kind"] == "hang" and alert["labels"]["job"] == JOB


@pytest.mark.slow
def test_watchdog_reaches_the_dead_mans_switch(hang_scenario):
    posts = hang_scenario.receiver.received("/webhook/deadmans-switch")
    assert any(alerts_in(p, "Watchdog", "firing") for p in posts)
    # nothing else pages or files a ticket during a hang that the supervisor handles
    for p in hang_scenario.receiver.received("/webhook/oncall-page"):
        assert {a["labels"]["alertname"] for a in p.body["alerts"]} == {"SupervisorTrainingHang"}, p.body
    assert not hang_scenario.receiver.received("/webhook/tickets")


@pytest.mark.slow
def test_a_real_scrape_passes_promtool_check_metrics(hang_scenario):
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=hang_scenario.scrape, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_every_dashboard_query_runs_on_prometheus_and_uses_exported_metrics(hang_scenario):
    sc = hang_scenario
    exported = exported_names(sc.scrape) | {"up"}  # up: Prometheus' own series for the target

    # the checkpoint interval needs two checkpoints published while this supervisor watched; on a
    # loaded machine the hang can come before the second, so wait for the run to publish it
    def interval_scraped() -> bool:
        q = urllib.parse.quote(f'supervisor_checkpoint_interval_seconds{{job="{JOB}"}}')
        return bool(http_json(f"{sc.prom_url}/api/v1/query?query={q}")["data"]["result"])
    wait_until(interval_scraped, 90, "a scraped checkpoint interval", sc.diagnostics)
    # the range ends past now: its last 1 s step must not fall just before the newest sample
    start, end = sc.started, time.time() + 2
    empty = []
    for expr in dashboard_queries():
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exported, f"{expr!r} uses {sorted(names - exported)}, not in a real scrape"
        query = expr.replace("$job", JOB).replace("$__rate_interval", "5s")
        params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": "1"})
        reply = http_json(f"{sc.prom_url}/api/v1/query_range?{params}")
        assert reply["status"] == "success", (expr, reply)
        if not reply["data"]["result"]:
            empty.append(expr)
    # every panel has data over the run: the fault, the restart and the checkpoints all happened
    assert not empty, f"queries without data over the run: {empty}"


# ------------------------------------------------------------- Alertmanager routing, alone
def _alert(name: str, severity: str, job: str, **labels: str) -> dict:
    return {"labels": {"alertname": name, "severity": severity, "job": job, **labels},
            "annotations": {"summary": f"{name} for {job}", "description": "d",
                            "runbook_url": "https://git.example.com/elastic-supervisor/blob/main/docs/runbook.md"},
            "generatorURL": "http://127.0.0.1/graph"}


@pytest.mark.slow
@needs_alertmanager
def test_alertmanager_pages_groups_by_job_and_inhibits_hang_noise(tmp_path):
    receiver = Receiver().start()
    am = None
    try:
        am, port = start_alertmanager(tmp_path, receiver)
        am.wait_ready()
        post_alerts(port, [
            _alert("SupervisorTrainingHang", "page", "llm", instance="sv:9400", kind="collective_hang"),
            _alert("SupervisorRestartStorm", "page", "llm", instance="sv:9400"),
            _alert("SupervisorHeartbeatStale", "warning", "llm", instance="sv:9400"),
            _alert("SupervisorHeartbeatStale", "warning", "other", instance="sv:9401"),
            # another job with the same (default) name on another supervisor: not inhibited
            _alert("SupervisorHeartbeatStale", "warning", "job", instance="sv:9402"),
            _alert("SupervisorTrainingHang", "page", "job", instance="sv:9403", kind="hang"),
        ])

        def settled():
            pages = receiver.received("/webhook/oncall-page")
            tickets = receiver.received("/webhook/tickets")
            pd = receiver.received("/pagerduty")
            llm = [p for p in pages if p.body["groupLabels"] == {"job": "llm"}]
            # (each group notifies on its own: the other job's PagerDuty event may come first)
            llm_pd = [p for p in pd if p.body["event_action"] == "trigger" and p.body["payload"]["group"] == "llm"]
            if llm_pd and tickets and llm and len(llm[-1].body["alerts"]) == 2:
                return llm, tickets, llm_pd
        pages, tickets, _ = wait_until(settled, 30, "pages and tickets", lambda: json.dumps(
            [(p.path, p.body) for p in receiver.posts])[:3000] + am.output())
        # the job's two page alerts arrive as one notification, grouped by job (and its PagerDuty
        # trigger came: the wait above ends on it)
        assert pages[-1].body["groupLabels"] == {"job": "llm"}
        assert {a["labels"]["alertname"] for a in pages[-1].body["alerts"]} == {
            "SupervisorTrainingHang", "SupervisorRestartStorm"}
        time.sleep(2.5)  # two more group intervals: nothing else may arrive
        tickets = receiver.received("/webhook/tickets")
        ticketed = {(a["labels"]["job"], a["labels"]["alertname"]) for p in tickets for a in p.body["alerts"]}
        # the stale heartbeat under the hang is inhibited; the other jobs' are not, even one whose
        # name is the same as the hung job's on another supervisor
        assert ticketed == {("other", "SupervisorHeartbeatStale"), ("job", "SupervisorHeartbeatStale")}, ticketed
        state = http_json(f"http://127.0.0.1:{port}/api/v2/alerts?inhibited=true")
        inhibited = {(a["labels"]["job"], a["labels"]["alertname"]) for a in state if a["status"]["inhibitedBy"]}
        assert inhibited == {("llm", "SupervisorHeartbeatStale")}, state
    finally:
        if am is not None:
            am.stop()
        receiver.stop()


# ------------------------------------------------------------------------- a release rolled back
@pytest.mark.slow
@needs_prometheus
@needs_alertmanager
def test_a_release_rolled_back_pages_with_both_versions_and_the_reason(tmp_path):
    """v1 of the job trains past its probation and is stopped; v2 (its script edited to import a
    module the environment lacks) is started on the same directories with Prometheus scraping
    it: the supervisor rolls back to v1 within seconds (before or after the first scrape, by
    chance), and the page reaches the on-call webhook naming both versions and the reason."""
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    shutil.copy(REPO / "examples" / "train.py", script)
    job = ["--steps", "400", "--checkpoint-every", "5", "--step-sleep", "0.05"]
    v1 = SupervisorRun(tmp_path, job, script=script, extra=["--job", "e2e-release"])
    try:
        known = v1.wait_event("release_known_good", timeout=120)
        v1.proc.send_signal(signal.SIGTERM)
        assert v1.wait() == 10, v1.output()[-3000:]
    finally:
        v1.kill()
    lines = script.read_text().splitlines(keepends=True)
    at = next(i + 1 for i, line in enumerate(lines) if line.startswith("from __future__"))
    script.write_text("".join(lines[:at] + ["import a_module_the_new_image_lacks  # v2\n"] + lines[at:]))
    with alert_stack(tmp_path) as st:
        receiver = st.receiver
        run = st.run = SupervisorRun(tmp_path, job, script=script,
                                     extra=["--job", "e2e-release", "--port", str(st.sv_port)])
        back = run.wait_event("release_rolled_back", timeout=120)
        assert back["to"] == known["version"] and back["reason"] == "startup_failure", back

        def page():
            for p in receiver.received("/webhook/oncall-page"):
                found = alerts_in(p, "SupervisorReleaseRolledBack", "firing")
                if found:
                    return found[0]
        alert = wait_until(page, 120, "the rollback page at the webhook receiver",
                           lambda: json.dumps([(p.path, p.body.get("status")) for p in receiver.posts])[:2000])
        labels = alert["labels"]
        assert (labels["job"], labels["from"], labels["to"], labels["reason"], labels["severity"]) == (
            "e2e-release", back["from"], back["to"], "startup_failure", "page"), labels
        assert back["from"] in alert["annotations"]["summary"] and back["to"] in alert["annotations"]["summary"]
        assert run.proc.poll() is None  # paged while the job trains on, on v1
