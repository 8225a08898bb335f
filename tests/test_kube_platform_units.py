"""The Kubernetes platform against the fake API server through the real client, with the test
writing pod and node status as a kubelet would: what it creates, how it reads each state a
pod can reach, attempt fencing, adoption, leader fencing and API failures. The end-to-end runs
with real processes are in tests/test_kube_platform.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kubernetes import client

from fakes.kube_apiserver import FakeKubeAPIServer
from supervisor.platforms.base import LaunchSpec, NodeState, PlatformError
from supervisor.platforms.kube.client import KubeApi
from supervisor.platforms.kube.platform import KubernetesPlatform, Settings, exit_code, read_mounted_token
from supervisor.platforms.kube.settings import VolumeConfig, VolumesConfig, WorkerConfig

NS = "ml"
TOKEN = "ab" * 24


@pytest.fixture
def api():
    server = FakeKubeAPIServer().start()
    yield server
    server.stop()


def platform(api, tmp_path: Path, retry: float = 2, **kw) -> KubernetesPlatform:
    (tmp_path / "token").write_text(TOKEN)
    settings = Settings(namespace=NS, job="Job_1", image="img:1", **({"slots": 2} | kw))
    p = KubernetesPlatform(KubeApi(client.ApiClient(api.configuration()), timeout_s=2, retry_s=retry),
                           settings).start(wait_s=10)
    p.token_env(tmp_path / "token")
    return p


def spec(attempt: int = 0, nodes=("slot-0", "slot-1")) -> LaunchSpec:
    return LaunchSpec(attempt=attempt, nodes=list(nodes), nnodes_min=len(nodes), nnodes_max=len(nodes),
                      nproc_per_node=1, command=["python", "train.py"], env={"SUPERVISOR_JOB": "j"},
                      rdzv_endpoint="ignored:29400", rdzv_id=f"j-{attempt}")


def run(coro):
    return asyncio.run(coro)


def set_status(api, name: str, status: dict) -> None:
    v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
    v1.patch_namespaced_pod_status(name, NS, {"status": status})


def until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def terminated(code: int, reason: str = "Error") -> dict:
    return {"phase": "Failed" if code else "Succeeded",
            "containerStatuses": [{"name": "agent", "ready": False, "restartCount": 0, "image": "img:1", "imageID": "",
                                   "state": {"terminated": {"exitCode": code, "reason": reason}}}]}


def test_launch_makes_named_labelled_pods_a_headless_service_and_a_token_secret(api, tmp_path):
    p = platform(api, tmp_path, worker=WorkerConfig(image="img:1", resources={"limits": {"nvidia.com/gpu": 8}},
                                                    tolerations=[{"key": "gpu", "operator": "Exists"}],
                                                    shm_size="8Gi", labels={"team": "a"}),
                 volumes=VolumesConfig(checkpoints=VolumeConfig("ckpt", "llama", "/ckpt")))
    try:
        p.exclude(["bad-node"])
        run(p.launch(spec()))
        pods = {o["metadata"]["name"]: o for o in api.objects("pods", NS)}
        assert sorted(pods) == ["job-1-a0-slot-0", "job-1-a0-slot-1"]  # RFC 1123 names from "Job_1"
        first = pods["job-1-a0-slot-0"]
        labels = first["metadata"]["labels"]
        assert labels | {"team": "a"} == labels and labels["elastic-supervisor/attempt"] == "0"
        assert labels["app.kubernetes.io/managed-by"] == "elastic-supervisor"
        (c,) = first["spec"]["containers"]
        argv = c["command"]
        assert "--rdzv-endpoint=job-1-a0-slot-0.job-1-rdzv.ml.svc:29400" in argv and any("is_host=1" in a for a in argv)
        second_argv = pods["job-1-a0-slot-1"]["spec"]["containers"][0]["command"]
        assert any("is_host=0" in a for a in second_argv)
        assert c["resources"] == {"limits": {"nvidia.com/gpu": "8"}}  # a quantity, as the API writes it
        assert {"name": "checkpoints", "mountPath": "/ckpt", "subPath": "llama"} in c["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert first["spec"]["restartPolicy"] == "Never" and first["spec"]["automountServiceAccountToken"] is False
        assert first["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]}]}]
        env = {e["name"]: e for e in c["env"]}
        assert env["SUPERVISOR_TOKEN"] == {"name": "SUPERVISOR_TOKEN", "valueFrom": {
            "secretKeyRef": {"name": "job-1-token", "key": "token"}}}
        assert TOKEN not in str(first)  # the token is in the Secret only
        svc = api.get("services", NS, "job-1-rdzv")
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert api.get("secrets", NS, "job-1-token")["data"]["token"]
    finally:
        p.close()


def test_each_state_a_pod_reaches_is_read_as_the_controller_needs_it(api, tmp_path):
    p = platform(api, tmp_path, slots=4)
    try:
        run(p.launch(spec(nodes=("slot-0", "slot-1", "slot-2", "slot-3"))))
        set_status(api, "job-1-a0-slot-0", {"phase": "Running", "podIP": "10.0.0.1"})
        set_status(api, "job-1-a0-slot-1", terminated(137))  # killed by SIGKILL: 128 + 9
        set_status(api, "job-1-a0-slot-2", {"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted"}]})
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        v1.delete_namespaced_pod("job-1-a0-slot-3", NS, grace_period_seconds=0)  # by someone else

        def observed():
            got = run(p.observe())
            return got if got["slot-3"].state == NodeState.LOST and got["slot-1"].state == NodeState.EXITED else None
        got = until(observed)
        assert got["slot-0"].state == NodeState.RUNNING
        assert got["slot-1"].exit_code == -9
        assert got["slot-2"].state == NodeState.LOST and "PreemptionByScheduler" in got["slot-2"].detail
        assert "deleted by someone else" in got["slot-3"].detail
    finally:
        p.close()


@pytest.mark.parametrize("code, reported", [(0, 0), (1, 1), (137, -9), (143, -15), (255, 255), (None, None)])
def test_container_exit_codes(code, reported):
    assert exit_code(code) == reported


def test_pods_of_an_older_attempt_are_deleted_on_sight(api, tmp_path):
    p = platform(api, tmp_path)
    try:
        run(p.launch(spec(0)))
        run(p.launch(spec(1)))  # the relaunch: attempt 0's pods are fenced
        until(lambda: all(o["metadata"].get("deletionTimestamp") or o["metadata"]["labels"][
            "elastic-supervisor/attempt"] == "1" for o in api.objects("pods", NS)))
    finally:
        p.close()


def test_a_new_run_never_takes_an_earlier_runs_finished_pods_for_its_own(api, tmp_path):
    before = platform(api, tmp_path)
    try:
        run(before.launch(spec(0)))  # the earlier run: attempt 0, finished
        for slot in ("slot-0", "slot-1"):
            set_status(api, f"job-1-a0-{slot}", terminated(0, "Completed"))
    finally:
        before.close()
    p = platform(api, tmp_path)  # the new run (--fresh, a new release): attempt 0 again
    try:
        until(lambda: len(p.pod_watch.snapshot()) == 2)
        earlier = api.get("pods", NS, "job-1-a0-slot-0")["metadata"]["labels"]["elastic-supervisor/launch"]
        run(p.launch(spec(0)))
        assert sorted(p.describe()["pods"].values()) == ["job-1-a0-slot-0-1", "job-1-a0-slot-1-1"]
        states = run(p.observe())
        assert {s: st.state for s, st in states.items()} == {"slot-0": NodeState.RUNNING, "slot-1": NodeState.RUNNING}
        ours = {o["metadata"]["name"]: o for o in api.objects("pods", NS)}
        assert ours["job-1-a0-slot-0-1"]["metadata"]["labels"]["elastic-supervisor/launch"] != earlier
        # the earlier run's pods are fenced: deleted, the new gang's untouched (each look goes on
        # with the deletions: a test's loop ends with each run(), the controller's never does)
        until(lambda: run(p.observe()) and sorted(o["metadata"]["name"] for o in api.objects("pods", NS)
                                                  if not o["metadata"].get("deletionTimestamp"))
              == ["job-1-a0-slot-0-1", "job-1-a0-slot-1-1"])
        assert "--rdzv-endpoint=job-1-a0-slot-0-1.job-1-rdzv.ml.svc:29400" in \
            ours["job-1-a0-slot-1-1"]["spec"]["containers"][0]["command"]  # the store's pod by its new name
    finally:
        p.close()


def test_an_earlier_run_s_pod_whose_deletion_fails_is_fenced_again_after_a_back_off(api, tmp_path, caplog):
    """The fence deletes an earlier run's pods once; a deletion the API server refuses (here a
    403 from a policy, any error past the client's retries alike) leaves the pod, which may hold
    a node the gang needs: an observation FENCE_RETRY_S later deletes it again (not every look,
    five times a second)."""
    before = platform(api, tmp_path)
    try:
        run(before.launch(spec(0)))
    finally:
        before.close()
    p = platform(api, tmp_path)

    def failures(n: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if f"a stale pod: tried again in {2 ** n:g} s, failure {n}"
                in r.getMessage()]

    def live() -> list[str]:
        return sorted(o["metadata"]["name"] for o in api.objects("pods", NS)
                      if not o["metadata"].get("deletionTimestamp"))

    async def until_async(predicate, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def scenario() -> None:  # one event loop, as the controller's: its deletions run to their end
        refused = api.inject_fault(403, verb="delete", resource="pods")
        await p.launch(spec(0))  # names taken: the new gang's are job-1-a0-slot-N-1; the old ones' deletions refused
        await until_async(lambda: len(failures(1)) == 2)
        deletes = api.request_counts()[("delete", "pods")]
        for _ in range(3):  # looks within the back-off ask nothing more
            await p.observe()
        assert api.request_counts()[("delete", "pods")] == deletes
        assert live() == ["job-1-a0-slot-0", "job-1-a0-slot-0-1", "job-1-a0-slot-1", "job-1-a0-slot-1-1"]
        api.remove_fault(refused)
        while live() != ["job-1-a0-slot-0-1", "job-1-a0-slot-1-1"]:  # a look 2 s on deletes them
            assert time.monotonic() < deadline, (live(), caplog.text[-2000:])
            await p.observe()
            await asyncio.sleep(0.2)

    try:
        until(lambda: len(p.pod_watch.snapshot()) == 2)
        deadline = time.monotonic() + 20
        run(scenario())
    finally:
        p.close()


@pytest.mark.parametrize("kind", ["budget", "pod_group"])
def test_an_earlier_run_s_budget_or_pod_group_of_another_size_is_replaced_and_a_retried_launch_s_kept(api, tmp_path,
                                                                                                     kind):
    """An attempt's PodDisruptionBudget and PodGroup are named by the attempt, and a new run starts
    at attempt 0 again: one left by a controller that died before its teardown, made for a gang of
    another size, would hold the new gang to the old count (a PodGroup's minMember of 4 for a gang
    of 2 never schedules it). It is replaced; the same object met again (a launch retried) is kept."""
    from supervisor.platforms.kube.gang import GangConfig

    kw = {"disruption_budget": True} if kind == "budget" else {"gang": GangConfig(mode="volcano")}
    api_client = client.ApiClient(api.configuration())
    policy, objects = client.PolicyV1Api(api_client), client.CustomObjectsApi(api_client)
    where = ("scheduling.volcano.sh", "v1beta1", NS, "podgroups")

    def made() -> dict:
        if kind == "budget":
            (pdb,) = policy.list_namespaced_pod_disruption_budget(NS).items
            return {"uid": pdb.metadata.uid, "count": pdb.spec.min_available,
                    "selects": pdb.spec.selector.match_labels}
        (group,) = objects.list_namespaced_custom_object(*where)["items"]
        return {"uid": group["metadata"]["uid"], "count": group["spec"]["minMember"]}

    before = platform(api, tmp_path, slots=4, **kw)
    try:
        run(before.launch(spec(0, nodes=("slot-0", "slot-1", "slot-2", "slot-3"))))  # the earlier run: 4 pods
    finally:
        before.close()
    old = made()
    assert old["count"] == 4
    p = platform(api, tmp_path, slots=4, **kw)  # the new run (its controller never tore the old one down)
    try:
        run(p.launch(spec(0)))
        new = made()
        assert new["count"] == 2 and new["uid"] != old["uid"]
        if kind == "budget":  # it selects the new gang's pods
            assert new["selects"]["elastic-supervisor/attempt"] == "0"
            selected = [o["metadata"]["name"] for o in api.objects("pods", NS)
                        if new["selects"].items() <= (o["metadata"]["labels"] or {}).items()]
            assert sorted(selected) == ["job-1-a0-slot-0-1", "job-1-a0-slot-1-1"], selected
        run(p.launch(spec(0)))  # the same launch tried again: the object made for it stays
        assert made() == new
    finally:
        p.close()

def test_a_stale_budget_held_by_a_finalizer_is_waited_for_then_replaced(api, tmp_path):
    """An earlier run's budget that a finalizer holds (deleting, or deleted by this launch) is not
    taken for the new gang's: the launch waits for it to go (``delete_confirm_s``), fails naming
    the finalizer while it stays (the launch is retried), and makes the new one once it is gone."""
    policy = client.PolicyV1Api(client.ApiClient(api.configuration()))
    before = platform(api, tmp_path, slots=4, disruption_budget=True)
    try:
        run(before.launch(spec(0, nodes=("slot-0", "slot-1", "slot-2", "slot-3"))))
    finally:
        before.close()
    (old,) = policy.list_namespaced_pod_disruption_budget(NS).items
    policy.patch_namespaced_pod_disruption_budget(old.metadata.name, NS,
                                                  {"metadata": {"finalizers": ["example.com/hold"]}})
    p = platform(api, tmp_path, slots=4, disruption_budget=True, delete_confirm_s=1.0)
    try:
        with pytest.raises(PlatformError, match=rf"PodDisruptionBudget {old.metadata.name} \(an earlier launch's, "
                                                r"for another gang\) is still being deleted after 1 s \(finalizers: "
                                                r"example.com/hold\)"):
            run(p.launch(spec(0)))
        held = policy.read_namespaced_pod_disruption_budget(old.metadata.name, NS)
        assert held.metadata.deletion_timestamp and held.spec.min_available == 4  # deleting, not yet gone
        policy.patch_namespaced_pod_disruption_budget(old.metadata.name, NS, {"metadata": {"finalizers": None}})
        run(p.launch(spec(0)))  # the launch tried again
        (new,) = policy.list_namespaced_pod_disruption_budget(NS).items
        assert new.spec.min_available == 2 and new.metadata.uid != old.metadata.uid
    finally:
        p.close()

def test_a_retried_launch_does_not_take_its_terminating_pods_for_new_ones(api, tmp_path):
    p = platform(api, tmp_path)
    try:
        run(p.launch(spec(1)))
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        for slot in ("slot-0", "slot-1"):  # scheduled, running; torn down, still Terminating (a slow node)
            v1.create_namespaced_pod_binding(f"job-1-a1-{slot}", NS, {"target": {"kind": "Node", "name": "n1"}},
                                             _preload_content=False)  # the answer is a Status (client #825)
            set_status(api, f"job-1-a1-{slot}", {"phase": "Running"})
            v1.delete_namespaced_pod(f"job-1-a1-{slot}", NS, grace_period_seconds=300)
        until(lambda: all(o.metadata.deletion_timestamp for o in p.pod_watch.snapshot().values()))
        run(p.launch(spec(1)))  # the same attempt, tried again
        assert sorted(p.describe()["pods"].values()) == ["job-1-a1-slot-0-1", "job-1-a1-slot-1-1"]
        assert {st.state for st in run(p.observe()).values()} == {NodeState.RUNNING}
    finally:
        p.close()


def test_adoption_takes_a_whole_live_gang_and_refuses_a_broken_one(api, tmp_path):
    p = platform(api, tmp_path)
    try:
        run(p.launch(spec(3)))
        saved = p.describe()
        fresh = platform(api, tmp_path)
        try:
            assert run(fresh.adopt(saved, 3)) is True
            assert sorted(run(fresh.observe())) == ["slot-0", "slot-1"]
            set_status(api, "job-1-a3-slot-1", terminated(1))
            other = platform(api, tmp_path)
            try:
                until(lambda: other.pod_watch.snapshot()["job-1-a3-slot-1"].status.phase == "Failed")
                assert run(other.adopt(saved, 3)) is False
            finally:
                other.close()
        finally:
            fresh.close()
    finally:
        p.close()


def test_a_platform_that_lost_its_lease_refuses_to_act(api, tmp_path):
    p = platform(api, tmp_path)
    try:
        run(p.launch(spec()))
        p.fenced = "the Lease ml/job-1-controller is no longer ours"
        for action in (p.kill_node("slot-0"), p.teardown(0), p.launch(spec(1))):
            with pytest.raises(PlatformError, match="not acting: the Lease"):
                run(action)
        assert len(api.objects("pods", NS)) == 2 and not any(o["metadata"].get("deletionTimestamp")
                                                              for o in api.objects("pods", NS))
    finally:
        p.close()


def test_an_api_server_that_keeps_failing_is_a_platform_error_naming_the_call(api, tmp_path):
    p = platform(api, tmp_path, retry=1)
    try:
        api.inject_fault(503, verb="create", resource="pods")
        started = time.monotonic()
        with pytest.raises(PlatformError, match=r"create_namespaced_pod failed: HTTP 503"):
            run(p.launch(spec()))
        assert time.monotonic() - started < 20
    finally:
        p.close()


def test_a_mounted_secret_token_is_read_through_its_symlinks_but_not_out_of_its_folder(tmp_path):
    vol = tmp_path / "secret"
    data = vol / "..2026_12_01_00_00_00.1"
    data.mkdir(parents=True)
    (data / "token").write_text(TOKEN + "\n")
    (vol / "..data").symlink_to(data.name)
    (vol / "token").symlink_to("..data/token")
    assert read_mounted_token(vol / "token") == TOKEN.encode()
    (tmp_path / "elsewhere").write_text(TOKEN)
    (vol / "escape").symlink_to("../elsewhere")
    with pytest.raises(PlatformError, match="leads outside its own folder"):
        read_mounted_token(vol / "escape")
    (data / "short").write_text("abc")
    with pytest.raises(PlatformError, match="not a token of at least 48 hex digits"):
        read_mounted_token(data / "short")


def test_faults_and_kills_are_told_as_events_on_the_pods_and_a_role_without_events_is_said_once(
        api, tmp_path, caplog):
    p = platform(api, tmp_path)

    async def tell_and_wait(name: str, fields: dict, reason: str) -> list[dict]:
        p.tell(name, fields)
        deadline = time.monotonic() + 10
        while not (got := [e for e in api.objects("events", NS) if e["reason"] == reason]):
            assert time.monotonic() < deadline, api.objects("events", NS)
            await asyncio.sleep(0.02)
        return got

    async def scenario():
        await p.launch(spec())
        until(lambda: "job-1-a0-slot-1" in p.pod_watch.snapshot())
        (fault,) = await tell_and_wait("fault_detected", {
            "attempt": 0, "kind": "hang", "ranks": [1], "nodes": ["slot-1"], "culprit": True,
            "detail": "rank 1 never entered collective 7", "detection_s": 31.2}, "RankFault")
        assert fault["type"] == "Warning" and fault["involvedObject"]["name"] == "job-1-a0-slot-1"
        assert fault["involvedObject"]["uid"] == api.get("pods", NS, "job-1-a0-slot-1")["metadata"]["uid"]
        assert fault["message"] == "attempt 0: hang on rank(s) 1 after 31.2 s: rank 1 never entered collective 7"
        (kill,) = await tell_and_wait("action", {"attempt": 0, "action": "kill_node", "node": "slot-1",
                                                 "reason": "hang"}, "KilledBySupervisor")
        assert kill["involvedObject"]["name"] == "job-1-a0-slot-1"
        p.tell("heartbeat_late", {"attempt": 0})  # not for `kubectl describe`: no Event
        p.tell("action", {"attempt": 0, "action": "tear_down", "reason": "hang"})
        # a Role without events/create: one warning, then no more tries
        api.inject_fault(403, verb="create", resource="events")
        p.tell("nodes_excluded", {"nodes": ["slot-0"], "reason": "dead"})
        deadline = time.monotonic() + 10
        while "k8s_events_forbidden" not in caplog.text:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        tried = api.request_count(verb="create", resource="events")
        p.tell("nodes_excluded", {"nodes": ["slot-1"], "reason": "dead"})
        p.tell("job_finished", {"phase": "failed", "exit_code": 1, "reason": "x"})
        # a barrier, not a sleep: the launch's own API round trips run any post told before it
        await p.launch(spec(attempt=1))
        assert api.request_count(verb="create", resource="events") == tried

    try:
        with caplog.at_level("WARNING", logger="supervisor.platform.kube"):
            run(scenario())
        assert [e["reason"] for e in api.objects("events", NS)] in (["RankFault", "KilledBySupervisor"],
                                                                     ["KilledBySupervisor", "RankFault"])
        assert caplog.text.count("k8s_events_forbidden") == 1
    finally:
        p.close()



def test_capacity_probes_survive_a_controller_restart(api, tmp_path):
    p = platform(api, tmp_path, slots=3)
    try:
        run(p.launch(spec(1)))  # shrunk for capacity: slot-2 could not be placed
        run(p.probe_capacity(["slot-2"]))
        probe = p.probes["slot-2"]
        until(lambda: probe in p.pod_watch.snapshot())
        saved = p.describe()
    finally:
        p.close()
    fresh = platform(api, tmp_path, slots=3)  # the restarted controller adopts the shrunk gang
    try:
        until(lambda: probe in fresh.pod_watch.snapshot())
        assert run(fresh.adopt(saved, 1)) is True
        run(fresh.observe())  # not fenced as a stray: the gang still grows back once it is placed
        v1 = client.CoreV1Api(client.ApiClient(api.configuration()))
        v1.create_namespaced_pod_binding(probe, NS, {"target": {"kind": "Node", "name": "n1"}}, _preload_content=False)

        async def returned():
            return fresh.capacity_returned()  # on the loop, as the controller's tick calls it
        assert until(lambda: run(returned())) == ["slot-2"]
    finally:
        fresh.close()


def test_no_capacity_probe_outlives_the_gang_it_was_for(api, tmp_path):
    p = platform(api, tmp_path, slots=3)
    try:
        run(p.launch(spec(1)))  # shrunk for capacity; then the smaller gang completes
        run(p.probe_capacity(["slot-2"]))
        probe = p.probes["slot-2"]
        for slot in ("slot-0", "slot-1"):
            set_status(api, f"job-1-a1-{slot}", terminated(0, "Completed"))
        until(lambda: all(st.state == NodeState.EXITED for st in run(p.observe()).values()))
        # the completed job is not torn down: a probe left Pending would hold the slot's GPUs once placed
        assert all(o["metadata"]["name"] != probe or o["metadata"].get("deletionTimestamp")
                   for o in api.objects("pods", NS))
    finally:
        p.close()


def test_a_placed_pods_agent_waits_for_its_gang_as_long_as_the_controller_waits_for_capacity(api, tmp_path):
    # torchrun's usual 120 s join timeout ended the placed pods (exit 1) while the rest were still
    # Pending: a wait for capacity past 2 minutes became a failed attempt ("exited with code 1")
    from supervisor.config import from_dict
    from supervisor.platforms.kube.platform import join_timeout_s

    cfg = from_dict({"job": "j", "command": ["python", "train.py"], "restart": {"capacity_wait_s": 1800},
                     "platform": {"kind": "kubernetes", "kubernetes": {"worker": {"image": "img:1"}}}})
    assert join_timeout_s(cfg) == 1800 + cfg.health.startup_timeout_s
    assert join_timeout_s(from_dict({"job": "j", "command": ["python", "train.py"]})) >= 900  # restart.budget_s
    p = platform(api, tmp_path, join_timeout_s=join_timeout_s(cfg))
    try:
        run(p.launch(spec()))
        for pod in api.objects("pods", NS):
            conf = next(a for a in pod["spec"]["containers"][0]["command"] if a.startswith("--rdzv-conf="))
            assert f"join_timeout={int(join_timeout_s(cfg))}," in conf, conf
    finally:
        p.close()
