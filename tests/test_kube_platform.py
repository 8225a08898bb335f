"""The Kubernetes platform end to end: the supervisor as a real subprocess drives the real
``kubernetes`` client against the in-repo fake API server; the fake kubelet runs each pod as
real local processes (one real torchrun agent per pod, gloo ranks, pod IPs 127.0.0.N). Faults
are real: a pod deleted, a rank SIGSTOPped, a node's processes stopped and its Ready condition
False, an eviction and a preemption (DisruptionTarget, then a graceful delete), the controller
SIGKILLed. Each run's loss path is compared with an uninterrupted control under plain torchrun.
"""

from __future__ import annotations

import hashlib

import os
from pathlib import Path
import signal
import time

import pytest

from kube_harness import (  # noqa: F401  (cluster, control, kube_run: fixtures)
    JOB,
    JOB_NAME,
    NS,
    as_the_chart_installs_it,
    assert_allowed_by_the_charts_rbac,
    assert_same_path,
    cluster,
    control,
    finished,
    k8s_event,
    kube_run,
    served_verdict,
)
from conftest import losses_by_step, read_log, run_job
from supervisor.platforms.kube.client import USER_AGENT

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------ the tests
def test_a_job_runs_as_pods_and_completes_bit_identical(cluster, kube_run, control, tmp_path):
    # in a namespace that enforces PodSecurity restricted: the default worker pods are admitted
    cluster.kubelet.v1.create_namespace({"metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    run = kube_run(kube=as_the_chart_installs_it(cluster, tmp_path))
    launched = run.wait_event("launched", attempt=0)
    assert launched["nodes"] == ["fake-node-0", "fake-node-1"] and launched["world_size"] == 2
    done = finished(run)
    assert done["phase"] == "completed"
    assert done["heartbeats"]["node_frames"] > 0  # each pod's agent relayed its ranks' heartbeats
    assert_same_path(run, control)
    pods = cluster.pods(**{"elastic-supervisor/job": JOB_NAME})
    # the release's objects: named with a hash of its ConfigMap's uid, labelled with the uid
    uid = cluster.api.get("configmaps", NS, "demo-elastic-supervisor-config")["metadata"]["uid"]
    base = f"kjob-{hashlib.sha256(uid.encode()).hexdigest()[:5]}"
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{base}-a0-fake-node-0", f"{base}-a0-fake-node-1"]
    assert {p["metadata"]["labels"]["elastic-supervisor/owner"] for p in pods} == {uid}
    for p in pods:
        spec = p["spec"]
        assert spec["restartPolicy"] == "Never" and p["status"]["phase"] == "Succeeded"
        assert p["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "elastic-supervisor"
        (container,) = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        # the token reaches the ranks from the release's Secret, never as a value in the pod spec
        assert env["SUPERVISOR_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "demo-elastic-supervisor-token",
                                                                        "key": "token"}
        assert "SUPERVISOR_TOKEN_FILE" not in env
        assert [o["name"] for o in p["metadata"]["ownerReferences"]] == ["demo-elastic-supervisor-config"]
        node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert node["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [spec["nodeName"]]
    service = cluster.api.get("services", NS, f"{base}-rdzv")
    assert service["spec"]["selector"]["elastic-supervisor/owner"] == uid
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert cluster.api.request_count(verb="watch", resource="pods") >= 1  # observed by watch
    made = cluster.api.request_counts(user_agent=USER_AGENT)
    assert made[("watch", "nodes")] >= 1 and made[("get", "configmaps")] == 1
    assert not [r for _, r in made if r == "secrets"]  # the release's Secret: none written
    assert_allowed_by_the_charts_rbac(cluster.api)
    # `kubectl get events`: the job's own events are on the release's ConfigMap
    owner = "demo-elastic-supervisor-config"
    assert k8s_event(cluster, "GangLaunched", owner)["type"] == "Normal"
    ended = k8s_event(cluster, "JobFinished", owner)
    assert ended["type"] == "Normal" and ended["message"].startswith("completed (exit code 0)")
    assert ended["involvedObject"]["kind"] == "ConfigMap" and ended["involvedObject"]["uid"]


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_a_pod_deleted_mid_run_is_lost_not_a_bad_node_and_the_gang_resumes(cluster, kube_run, control, rendezvous):
    run = kube_run(overrides={"platform": {"rendezvous_backend": rendezvous}})
    assert run.wait_event("launched", attempt=0)["rendezvous"] == rendezvous
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    cluster.kubelet.v1.delete_namespaced_pod(pod["metadata"]["name"], NS)  # kubectl delete pod: graceful
    fault = run.wait_event("fault_detected")
    # the delete's SIGTERM reaches the ranks, which agree to stop (exit 143: preempted) and write
    # an emergency checkpoint; or the pod is seen gone first: lost, deleted by someone else
    assert fault["kind"] == "preempted" or "deleted by someone else" in fault["detail"], fault
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["excluded"] == [] and len(relaunch["nodes"]) == 2  # a deleted pod says nothing of its node
    assert relaunch["rendezvous"] == rendezvous
    assert int(relaunch["restore_from"].split("-")[1]) >= 10
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)
    # attempt fencing: nothing of attempt 0 is left
    assert not [p for p in cluster.pods(**{"elastic-supervisor/attempt": "0"})
                if p["status"].get("phase") not in ("Succeeded", "Failed")]


def test_a_sigstopped_rank_is_found_silent_its_pod_killed_and_the_gang_resumes(cluster, kube_run, control):
    run = kube_run(fault="kind=stop,rank=1,step=13,attempt=0")
    fault = run.wait_event("fault_detected")
    assert fault["kind"] == "dead" and fault["ranks"] == [1], fault
    kill = run.wait_event("action", action="kill_node")
    assert kill["node"] == fault["nodes"][0]
    # `kubectl describe pod` of the stopped rank's pod says what happened to it and why
    pod = f"{JOB_NAME}-a0-{kill['node']}"
    said = k8s_event(cluster, "RankFault", pod)
    assert said["type"] == "Warning" and "dead on rank(s) 1" in said["message"], said
    assert said["involvedObject"]["kind"] == "Pod" and said["involvedObject"]["uid"]
    assert k8s_event(cluster, "KilledBySupervisor", pod)["type"] == "Warning"
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["restore_from"] == "step-0000000010"
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_script_without_the_sdk_names_the_rank_that_skipped_an_all_reduce(cluster, kube_run, tmp_path):
    """A torch-only script (tests/workloads/plain_train.py: no supervisor import) in pods: the
    agents' instrumentation reports for it; rank 1 skips step 12's collectives and idles while
    rank 0 waits inside the all-reduce: rank 1 is named the culprit, from the flight recorder's
    numbers, and the job completes as it does uninterrupted."""
    plain = Path(__file__).parent / "workloads" / "plain_train.py"
    ctl = tmp_path / "control"
    run_job(ctl, 2, ["--steps", "30", "--out", str(ctl / "out")], script=plain)
    out = tmp_path / "out"
    run = kube_run(script=plain, job=["--steps", "30", "--out", str(out)],
                   overrides={"env": {"OMP_NUM_THREADS": "1", "PLAIN_FAULT": "skip@12:1",
                                      "PLAIN_FAULT_ONCE": str(tmp_path / "once")}})
    assert run.wait_event("running", attempt=0)["reported_by"] == {"torch": 2}
    fault = run.wait_event("fault_detected")
    assert (fault["kind"], fault["ranks"], fault["reported_by"]) == ("collective_hang", [1], {"torch": [1]}), fault
    assert "rank 1 never entered it" in fault["detail"] and "gloo:all_reduce" in fault["detail"]
    assert finished(run)["phase"] == "completed"
    got, want = losses_by_step(read_log(out, 0)), losses_by_step(read_log(ctl / "out", 0))
    assert {s: r["loss_hex"] for s, r in got.items()} == {s: r["loss_hex"] for s, r in want.items()}


def test_a_node_gone_not_ready_is_excluded_and_its_slot_goes_to_the_spare(cluster, kube_run, control):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    node = pod["spec"]["nodeName"]
    cluster.kubelet.node_not_ready(node)  # its processes stopped, Ready=False
    try:
        fault = run.wait_event("fault_detected")
        assert fault["kind"] == "dead" and fault["node_failure"] is True, fault
        relaunch = run.wait_event("launched", attempt=1)
        assert node not in relaunch["nodes"] and "fake-node-2" in relaunch["nodes"], relaunch
        assert relaunch["world_size"] == 2
        assert finished(run)["phase"] == "completed"
    finally:
        cluster.kubelet.node_ready(node)
    assert_same_path(run, control)


@pytest.mark.parametrize("how, reason", [("evict", "EvictionByEvictionAPI"), ("preempt", "PreemptionByScheduler")])
def test_an_evicted_or_preempted_pod_checkpoints_on_its_way_out_and_the_gang_resumes_there(
        cluster, kube_run, control, how, reason):
    run = kube_run()
    run.wait_checkpoint(10)
    pod = cluster.pod_of_rank(run.log_dir, 1, attempt=0)
    getattr(cluster.kubelet, how)(pod["metadata"]["name"])  # DisruptionTarget, then a graceful delete
    fault = run.wait_event("fault_detected")
    assert reason in fault["detail"] or fault["kind"] == "preempted", fault
    relaunch = run.wait_event("launched", attempt=1)
    assert relaunch["excluded"] == [], relaunch  # not a hardware fault
    # SIGTERM reached the ranks: every rank agreed to stop and the emergency checkpoint was written
    restored = int(relaunch["restore_from"].split("-")[1])
    assert restored % 5 != 0, relaunch
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_a_killed_controller_is_replaced_by_one_that_adopts_the_running_gang(cluster, kube_run, control):
    # the gang must outlast the Lease takeover (a few seconds): with ranks forked from their
    # agent, 30 steps of 0.1 s were over before the next controller could adopt them
    run = kube_run(job=[*JOB[:-1], "0.5"])
    run.wait_event("running", attempt=0)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()}
    os.killpg(run.proc.pid, signal.SIGKILL)  # the controller only: the pods train on
    run.proc.wait()
    run.start()  # what the Deployment does
    adopted = run.wait_event("adopted", timeout=90)
    assert adopted["attempt"] == 0
    assert finished(run)["phase"] == "completed"
    assert not run.events("launched")[1:], "the adopted gang was relaunched"
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods()} == pods  # the same pods
    assert_same_path(run, control)


def test_two_controllers_at_once_only_the_lease_holder_acts(cluster, kube_run, control, tmp_path):
    first = kube_run()
    first.wait_event("launched", attempt=0)
    second = kube_run(name="standby")
    # the standby campaigns for the Lease and waits: it launches nothing, kills nothing
    deadline = time.monotonic() + 60
    while "event=leader_election" not in second.output():
        assert time.monotonic() < deadline and second.proc.poll() is None, second.output()
        time.sleep(0.1)
    assert finished(first)["phase"] == "completed"
    assert_same_path(first, control)
    # the first released the Lease at the end; the standby leads now, finds the run finished and
    # does nothing (a Deployment's restarted controller must not train the job again)
    second.wait_event("job_already_finished", phase="completed")
    assert served_verdict(second)["phase"] == "completed"
    assert [e["attempt"] for e in first.events("launched")] == [0]  # one gang, launched once, by one controller
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0


def test_a_controller_killed_in_the_middle_of_a_restart_is_replaced_by_one_that_finishes_it(
        cluster, kube_run, control):
    # (a 10 s heartbeat timeout: the crashed pod's exit reaches the controller before its rank's
    # silence does, on a loaded host too; named "dead" otherwise, which is not what this tests)
    run = kube_run(fault="kind=crash,rank=1,step=13,attempt=0",
                   overrides={"heartbeat": {"interval_s": 0.5, "timeout_s": 10}})
    run.wait_event("action", action="tear_down")
    os.killpg(run.proc.pid, signal.SIGKILL)  # in the teardown, or in the launch that follows it
    run.proc.wait()
    run.start()
    assert finished(run)["phase"] == "completed"
    # the relaunch: attempt 1, or 2 when the first controller's launch of 1 was cut short (the
    # next number fences whatever of it was made); the recovery finished, not detected again
    relaunch = run.events("launched")[-1]
    assert relaunch["restore_from"] == "step-0000000010" and relaunch["attempt"] in (1, 2)
    assert [e["kind"] for e in run.events("fault_detected")] == ["crash"]
    assert not [p for p in cluster.pods() if p["metadata"]["labels"].get("elastic-supervisor/attempt") !=
                str(relaunch["attempt"]) and p["status"].get("phase") not in ("Succeeded", "Failed")]
    # whatever the killed controller's teardown left of the attempt it ended, its budget included, is gone
    assert [b["metadata"]["labels"]["elastic-supervisor/attempt"] for b in cluster.api.objects(
        "poddisruptionbudgets", NS)] == [str(relaunch["attempt"])]
    assert_same_path(run, control)


def test_sigterm_to_the_controller_hands_the_running_gang_to_the_next_one(cluster, kube_run, control):
    run = kube_run()
    run.wait_event("running", attempt=0)
    run.proc.send_signal(signal.SIGTERM)  # its pod is replaced (helm upgrade, a drained node)
    assert run.wait(timeout=60) == 0
    assert run.events("controller_handoff") and not run.events("job_finished")
    assert all(p["status"]["phase"] == "Running" for p in cluster.pods())  # the gang trained on
    run.start()
    run.wait_event("adopted", attempt=0)
    assert finished(run)["phase"] == "completed"
    assert_same_path(run, control)


def test_an_api_server_down_for_a_while_stops_no_training(cluster, kube_run, control):
    run = kube_run(job=[*JOB[:-1], "0.5"])  # long enough to outlast the outage and a controller restart
    run.wait_event("running", attempt=0)
    outage = cluster.api.inject_fault(503, user_agent="elastic-supervisor-controller")
    cluster.api.close_watches()
    ckpt_before = sorted(p.name for p in run.ckpt.glob("step-*"))
    # the controller cannot renew its Lease: it stops acting (it may not prove it leads) and
    # leaves, killing nothing; the pods train on meanwhile
    run.wait_event("leadership_lost", timeout=60)
    assert run.wait(timeout=60) == 1
    deadline = time.monotonic() + 60
    while sorted(p.name for p in run.ckpt.glob("step-*")) == ckpt_before:
        assert time.monotonic() < deadline, "no checkpoint written while the API server was down"
        time.sleep(0.1)
    cluster.api.remove_fault(outage)
    run.start()  # what the Deployment does
    run.wait_event("adopted", attempt=0)
    assert finished(run)["phase"] == "completed"
    assert [e["attempt"] for e in run.events("launched")] == [0]  # never relaunched
    assert_same_path(run, control)
