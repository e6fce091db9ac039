"""What Kubernetes reports, translated into the project's typed events.
The objects have the shapes the apiserver returns (Pod disruption
conditions, node conditions, container states, Kubernetes 1.34)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from trainwarden.classify import classify
from trainwarden.events import InstanceExited, NodeLost, Preempted
from trainwarden.rules.loader import load_rules
from trainwarden.runtime.kubernetes.observe import Incarnation, node_view, pod_view, translate

NOW = 1_000.0


def _pod(name="tw-job-worker-0-0", node="n1", phase="Running", instance="worker-0", uid="u-0"):
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "labels": {"trainwarden.io/job": "job"},
                     "annotations": {"trainwarden.io/instance": instance, "trainwarden.io/job-id": "job"}},
        "spec": {"nodeName": node, "containers": [{"name": "instance", "image": "train:1"}]},
        "status": {"phase": phase, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
                   "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                   "lastTransitionTime": "2026-12-06T09:00:00Z"},
                                  {"type": "Ready", "status": "True", "lastProbeTime": None,
                                   "lastTransitionTime": "2026-12-06T09:00:01Z"}],
                   "containerStatuses": [{"name": "instance", "ready": True, "restartCount": 0,
                                          "image": "train:1", "imageID": "", "containerID": "containerd://abc",
                                          "state": {"running": {"startedAt": "2026-12-06T09:00:01Z"}}}]},
    }


def _disrupted(reason, message):
    pod = _pod()
    pod["metadata"]["deletionTimestamp"] = "2026-12-06T09:05:00Z"
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                        "lastTransitionTime": "2026-12-06T09:05:00Z", "reason": reason,
                                        "message": message})
    return pod


def _node(name="n1", status="True", reason="KubeletReady", message="kubelet is posting ready status"):
    return {"kind": "Node", "metadata": {"name": name},
            "spec": {"taints": [{"key": "trainwarden.io/isolated", "value": "true", "effect": "NoSchedule"}]}
            if name == "isolated" else {},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "conditions": [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                                      {"type": "Ready", "status": status, "reason": reason, "message": message}]}}


CURRENT = {"tw-job-worker-0-0": Incarnation("worker-0", 2, 0)}


def _translate(pods, nodes, said=frozenset()):
    return translate("job", NOW, [pod_view(p) for p in pods], {n["metadata"]["name"]: node_view(n) for n in nodes},
                     CURRENT, said)


def test_each_disruption_target_reason_is_the_same_preempted_event_as_slurms_preemption():
    for reason, message in (("EvictionByEvictionAPI", "Eviction API: evicting"),
                            ("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod"),
                            ("TerminationByKubelet", "The node was low on resource: memory."),
                            ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")):
        events, _ = _translate([_disrupted(reason, message)], [_node()])
        assert len(events) == 1 and isinstance(events[0], Preempted), reason
        assert events[0].round == 2 and message in events[0].reason and "tw-job-worker-0-0" in events[0].reason


def test_a_disruption_is_said_once_however_often_the_pod_is_seen():
    events, said = _translate([_disrupted("EvictionByEvictionAPI", "Eviction API: evicting")], [_node()])
    again, _ = _translate([_disrupted("EvictionByEvictionAPI", "Eviction API: evicting")], [_node()], said)
    assert len(events) == 1 and again == []


def test_a_disruption_target_that_is_false_is_not_a_preemption():
    pod = _disrupted("EvictionByEvictionAPI", "")
    pod["status"]["conditions"][-1]["status"] = "False"
    assert _translate([pod], [_node()])[0] == []


def test_a_node_not_ready_unknown_or_deleted_under_the_jobs_pod_is_node_loss():
    for nodes in ([_node(status="False", reason="KubeletNotReady", message="container runtime is down")],
                  [_node(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.")],
                  []):
        events, _ = _translate([_pod()], nodes)
        assert events == [NodeLost(job_id="job", time=NOW, node="n1", instances=("worker-0",))]


def test_a_pod_on_a_lost_node_that_the_taint_manager_deletes_is_node_loss_not_preemption():
    events, _ = _translate([_disrupted("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")],
                           [_node(status="Unknown", reason="NodeStatusUnknown")])
    assert [type(e) for e in events] == [NodeLost]


def test_a_pod_whose_container_was_oom_killed_is_its_instances_exit_with_the_code():
    pod = _pod(phase="Failed")
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-12-06T09:00:01Z",
        "finishedAt": "2026-12-06T09:03:00Z", "containerID": "containerd://abc"}}
    view = pod_view(pod)
    assert (view.exit_code, view.exit_reason, view.running) == (137, "OOMKilled", False)
    events, _ = _translate([pod], [_node()])
    line, exited = events
    assert exited == InstanceExited(job_id="job", time=NOW, instance="worker-0", round=2, start=0, exit_code=137)
    assert (line.instance, line.round, line.text) == ("worker-0", 2, "trainwarden: Kubernetes ended pod "
                                                      "tw-job-worker-0-0's container on node n1: Reason: OOMKilled, "
                                                      "Exit Code: 137")
    verdict = classify(load_rules(), exited.exit_code, [line.text])
    assert (verdict.rule, verdict.verdict.value) == ("k8s_container_oom_killed", "not_retryable"), verdict


def test_a_container_that_cannot_start_is_an_exit_127():
    pod = _pod(phase="Pending")
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {
        "reason": "ErrImageNeverPull", "message": "Container image \"train:1\" is not present with pull policy of Never"}}
    events, _ = _translate([pod], [_node()])
    assert [e.exit_code for e in events if isinstance(e, InstanceExited)] == [127]
    assert "Reason: ErrImageNeverPull" in events[0].text


def test_a_running_pod_on_a_ready_node_says_nothing_and_a_pod_of_another_generation_is_ignored():
    other = copy.deepcopy(_pod(name="tw-job-worker-0-1", phase="Failed"))
    assert _translate([_pod(), other], [_node()])[0] == []


def test_a_node_view_knows_its_address_and_trainwardens_isolation():
    view = node_view(_node("isolated"))
    assert (view.ready, view.isolated, view.address) == (True, True, "127.0.0.1")
    assert "Kubelet stopped posting" in node_view(_node(status="Unknown", reason="NodeStatusUnknown",
                                                        message="Kubelet stopped posting node status.")).trouble


DATA = Path(__file__).parent / "data"


def _captured(name):
    """An object as the local cluster's apiserver returned it (tests/k8s/data, captured by hand)."""
    return json.loads((DATA / name).read_text())


def test_a_pod_the_real_apiserver_evicted_is_a_preemption():
    pod = _captured("pod_evicted.json")
    current = {pod["metadata"]["name"]: Incarnation("worker-0", 4, 1)}
    node = _captured("node_ready.json")
    node["metadata"]["name"] = pod["spec"]["nodeName"]
    events, _ = translate("job", NOW, [pod_view(pod)], {node["metadata"]["name"]: node_view(node)}, current,
                          frozenset())
    assert [type(e) for e in events] == [Preempted]
    assert events[0].round == 4 and "evicted through the Eviction API: Eviction API: evicting" in events[0].reason


def test_a_pod_whose_container_failed_on_the_real_cluster_is_its_instances_exit():
    pod = _captured("pod_failed.json")
    current = {pod["metadata"]["name"]: Incarnation("worker-0", 0, 0)}
    node = _captured("node_ready.json")
    node["metadata"]["name"] = pod["spec"]["nodeName"]
    events, _ = translate("job", NOW, [pod_view(pod)], {node["metadata"]["name"]: node_view(node)}, current,
                          frozenset())
    assert [(type(e), e.exit_code) for e in events] == [(InstanceExited, 3)]
