"""What a pod's status says (supervisor.platforms.kube.pod_reading): the fields and values a real
cluster sets, read as the supervisor names them. One row per state the issue lists."""

from __future__ import annotations

import pytest

from supervisor.platforms.kube.pod_reading import Condition, ContainerFacts, PodFacts, Reading, read_pod

SCHED_MSG = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
             "3 No preemption victims found for incoming pod.")
PULL_MSG = ('failed to pull and unpack image "docker.io/library/nope:1": failed to resolve reference '
            '"docker.io/library/nope:1": not found')


def unschedulable(message=SCHED_MSG):
    return PodFacts(phase="Pending", conditions=(Condition("PodScheduled", "False", "Unschedulable", message),))


def waiting(reason, message=""):
    return PodFacts(phase="Pending", node_name="n1",
                    conditions=(Condition("PodScheduled", "True"), Condition("Ready", "False", "ContainersNotReady")),
                    containers=(ContainerFacts("agent", waiting_reason=reason, waiting_message=message),))


def terminated(reason, code, phase="Failed", limit=""):
    return PodFacts(phase=phase, node_name="n1",
                    containers=(ContainerFacts("agent", terminated_reason=reason, exit_code=code, memory_limit=limit),))


CASES = [
    # (what the cluster says, reading, the cluster's word kept, text the message holds)
    ("scheduled, pulling", waiting("ContainerCreating"), Reading.STARTING, "", ""),
    ("no PodScheduled condition yet", PodFacts(phase="Pending"), Reading.STARTING, "", ""),
    ("running", PodFacts(phase="Running", node_name="n1"), Reading.RUNNING, "", ""),
    ("no GPUs free", unschedulable(), Reading.WAITING_FOR_CAPACITY, "Unschedulable", "Insufficient nvidia.com/gpu"),
    ("gated by Kueue", PodFacts(phase="Pending", scheduling_gates=("kueue.x-k8s.io/admission",),
                                conditions=(Condition("PodScheduled", "False", "SchedulingGated",
                                                      "Scheduling is blocked due to non-empty scheduling gates"),)),
     Reading.WAITING_FOR_CAPACITY, "SchedulingGated", "non-empty scheduling gates"),
    ("gates without a condition yet", PodFacts(phase="Pending", scheduling_gates=("g",)),
     Reading.WAITING_FOR_CAPACITY, "SchedulingGated", "g"),
    ("unknown image", waiting("ErrImagePull", PULL_MSG), Reading.CANNOT_START, "ErrImagePull", "failed to pull"),
    ("back-off", waiting("ImagePullBackOff", 'Back-off pulling image "nope:1"'), Reading.CANNOT_START,
     "ImagePullBackOff", "Back-off"),
    ("registry rate limit: waits", waiting("ErrImagePull", 'failed to pull and unpack image "docker.io/x:1": '
                                             "429 Too Many Requests - toomanyrequests: You have reached your pull "
                                             "rate limit"), Reading.STARTING, "", ""),
    ("registry timeout: waits", waiting("ImagePullBackOff", 'Back-off pulling image "x:1": dial tcp: i/o timeout'),
     Reading.STARTING, "", ""),
    ("registry unavailable: waits", waiting("RegistryUnavailable", "registry is down"), Reading.STARTING, "", ""),
    ("bad reference", waiting("InvalidImageName", "couldn't parse image name"), Reading.CANNOT_START,
     "InvalidImageName", "parse"),
    ("missing Secret", waiting("CreateContainerConfigError", 'secret "job-token" not found'), Reading.CANNOT_START,
     "CreateContainerConfigError", "job-token"),
    ("runtime refused", waiting("CreateContainerError", "x"), Reading.CANNOT_START, "CreateContainerError", "x"),
    ("exec failed", waiting("RunContainerError", "exec: no such file"), Reading.CANNOT_START, "RunContainerError",
     "exec"),
    ("OOM killed", terminated("OOMKilled", 137, limit="1Gi"), Reading.OUT_OF_MEMORY, "OOMKilled", "memory limit 1Gi"),
    ("OOM killed, agent exit 1 (cgroup v1: only the rank died)", terminated("OOMKilled", 1), Reading.OUT_OF_MEMORY,
     "OOMKilled", "exit code 1"),
    ("an exit", terminated("Error", 1), Reading.FAILED, "Error", ""),
    ("success", terminated("Completed", 0, phase="Succeeded"), Reading.SUCCEEDED, "Completed", ""),
    ("killed by a signal, not for memory", terminated("Error", 137), Reading.FAILED, "Error", ""),
    ("kubelet: no GPU left", PodFacts(phase="Failed", reason="OutOfnvidia.com/gpu", node_name="n1",
                                      message="Pod was rejected: Node didn't have enough resource: nvidia.com/gpu"),
     Reading.REJECTED_BY_NODE, "OutOfnvidia.com/gpu", "enough resource"),
    ("kubelet: device plugin", PodFacts(phase="Failed", reason="UnexpectedAdmissionError", node_name="n1",
                                        message="Allocate failed due to requested number of devices unavailable"),
     Reading.REJECTED_BY_NODE, "UnexpectedAdmissionError", "Allocate failed"),
    ("node pressure, done", PodFacts(phase="Failed", reason="Evicted", message="The node was low on resource: memory.",
                                     containers=(ContainerFacts("agent", terminated_reason="Error", exit_code=137),)),
     Reading.EVICTED, "Evicted", "low on resource"),
    ("node pressure, on its way out", PodFacts(phase="Running", conditions=(
        Condition("DisruptionTarget", "True", "TerminationByKubelet", "The node was low on resource: memory."),)),
     Reading.EVICTED, "TerminationByKubelet", "low on resource"),
    ("preempted", PodFacts(phase="Running", conditions=(
        Condition("DisruptionTarget", "True", "PreemptionByScheduler", "preempted by ml/big"),)),
     Reading.DISRUPTED, "PreemptionByScheduler", "preempted"),
    ("disruption withdrawn", PodFacts(phase="Running", conditions=(Condition("DisruptionTarget", "False"),)),
     Reading.RUNNING, "", ""),
]


@pytest.mark.parametrize("facts,kind,reason,text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_read_pod(facts, kind, reason, text):
    got = read_pod(facts)
    assert got.kind == kind
    assert got.reason == reason
    assert text in got.message


def test_an_admission_reject_wins_over_what_its_containers_say():
    # a rejected pod's containers may carry a terminated state of their own (the kubelet's doing)
    facts = PodFacts(phase="Failed", reason="OutOfcpu", message="Pod was rejected",
                     containers=(ContainerFacts("agent", terminated_reason="OOMKilled", exit_code=137),))
    assert read_pod(facts).kind == Reading.REJECTED_BY_NODE


def test_a_scheduled_pod_whose_condition_lags_is_not_waiting_for_capacity():
    # PodScheduled may still say False for a moment after the binding: the node name is the truth
    facts = PodFacts(phase="Pending", node_name="n1", conditions=(Condition("PodScheduled", "False", "Unschedulable"),))
    assert read_pod(facts).kind == Reading.STARTING
