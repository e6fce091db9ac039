"""What Kubernetes reports, as the project's typed events. Pure: pods and
nodes come in as the API's JSON (dicts), the time as a number.

- A pod condition ``DisruptionTarget`` (status True) says Kubernetes is
  taking the pod away: the scheduler preempting it for a higher-priority
  pod, the Eviction API (``kubectl drain``), the kubelet under node
  pressure or shutting down, the taint manager. Not a fault of the job:
  the same ``Preempted`` event as a batch scheduler's preemption.
- A node whose ``Ready`` condition is False or Unknown, or that is gone
  from the API, while it holds the job's pods: ``NodeLost``.
- A pod whose container terminated (the pod host itself ended: OOMKilled,
  killed, failed to start) is its instance's exit, with the container's
  code; a reason other than a plain error (OOMKilled, an image it cannot
  pull) comes first as the instance's line, for the rules to read. An incarnation's own exit inside a running pod is the pod host's
  and the agent's to report, not this module's.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Optional

from trainwarden.events import InstanceExited, LogLine, NodeLost, Preempted, Stream
from trainwarden.runtime.kubernetes.manifests import INSTANCE_ANNOTATION, ISOLATED_TAINT

# The reasons Kubernetes gives DisruptionTarget (Pod disruption conditions, 1.26+).
DISRUPTIONS = {
    "PreemptionByScheduler": "preempted by the scheduler for a higher-priority pod",
    "EvictionByEvictionAPI": "evicted through the Eviction API",
    "TerminationByKubelet": "terminated by the kubelet (node pressure or shutdown)",
    "DeletionByTaintManager": "deleted by the taint manager (a NoExecute taint it does not tolerate)",
    "DeletionByPodGC": "deleted by the pod garbage collector (its node is gone)",
    "TerminationByTrainwarden": "released by Trainwarden: the spot market took its capacity back",
}
# A container that never ran its command: its code says nothing of the job.
CANNOT_START = 127
# A container's end that its exit code says all of; any other reason is said as a line.
PLAIN_ENDS = frozenset({"", "Error", "Completed"})


@dataclasses.dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    instance: str  # from the annotation; "" for a pod that is not one of ours
    node: str  # "" while unscheduled
    phase: str
    running: bool  # the container runs (the pod host can be driven)
    deleting: bool
    disruption: str  # the DisruptionTarget reason, "" when none
    disruption_message: str
    exit_code: Optional[int]  # the container's, once it terminated
    exit_reason: str  # OOMKilled, Error, Completed, ContainerCannotRun, ...
    host_ip: str


@dataclasses.dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    trouble: str  # why it is not ready, "" when it is
    isolated: bool  # carries Trainwarden's taint
    address: str  # InternalIP, else the first address


def pod_view(pod: Mapping) -> PodView:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    disruption, message = "", ""
    for condition in status.get("conditions") or ():
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            disruption, message = condition.get("reason") or "Unknown", condition.get("message") or ""
    exit_code, exit_reason, running = None, "", False
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        if state.get("running") is not None:
            running = True
        terminated = state.get("terminated")
        if terminated is not None:
            exit_code, exit_reason = int(terminated.get("exitCode", 0)), terminated.get("reason") or ""
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in ("CreateContainerError", "CreateContainerConfigError", "ErrImagePull",
                                     "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
            exit_code, exit_reason = CANNOT_START, waiting["reason"]
    return PodView(name=meta.get("name", ""), uid=meta.get("uid", ""),
                   instance=(meta.get("annotations") or {}).get(INSTANCE_ANNOTATION, ""),
                   node=spec.get("nodeName") or "", phase=status.get("phase") or "Pending",
                   running=running and status.get("phase") == "Running",
                   deleting=bool(meta.get("deletionTimestamp")), disruption=disruption,
                   disruption_message=message, exit_code=exit_code, exit_reason=exit_reason,
                   host_ip=status.get("hostIP") or "")


def node_view(node: Mapping) -> NodeView:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    ready, trouble = False, "it reports no Ready condition"
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            state = "NotReady" if condition.get("status") == "False" else "Unknown"
            trouble = "" if ready else f"{state}: {condition.get('reason') or ''} {condition.get('message') or ''}".strip()
    addresses = status.get("addresses") or []
    internal = [a.get("address", "") for a in addresses if a.get("type") == "InternalIP"]
    taints = (node.get("spec") or {}).get("taints") or ()
    return NodeView(name=meta.get("name", ""), ready=ready, trouble=trouble,
                    isolated=any(t.get("key") == ISOLATED_TAINT for t in taints),
                    address=(internal or [a.get("address", "") for a in addresses] or [""])[0])


def disruption_text(pod: PodView) -> str:
    """One sentence for the job's history: which pod, and what Kubernetes said."""
    what = DISRUPTIONS.get(pod.disruption, f"disrupted ({pod.disruption})")
    said = f": {pod.disruption_message}" if pod.disruption_message else ""
    return f"Kubernetes took pod {pod.name} on node {pod.node or '?'} away, {what}{said}"


@dataclasses.dataclass(frozen=True)
class Incarnation:
    instance: str
    round: int
    start: int


def translate(job_id: str, now: float, pods: Iterable[PodView], nodes: Mapping[str, NodeView],
              current: Mapping[str, Incarnation], said: frozenset) -> tuple[list, frozenset]:
    """The events the job's pods and their nodes call for, each said once
    (``said`` keys what was: returned with the new ones). ``current`` maps
    a pod's name to the incarnation it holds; a pod of an older generation
    is not the job's any more. A disruption of a pod on a node that is lost
    is the node's loss, said as such."""
    events: list = []
    said_now = set(said)
    lost: dict[str, list[str]] = {}
    ours = [pod for pod in pods if pod.name in current]
    for pod in ours:
        if not pod.node:
            continue
        node = nodes.get(pod.node)
        if node is None or not node.ready:
            lost.setdefault(pod.node, []).append(current[pod.name].instance)
    for node_name, instances in sorted(lost.items()):
        key = ("lost", node_name, tuple(sorted((current_of(current, i)) for i in instances)))
        if key not in said_now:
            said_now.add(key)
            events.append(NodeLost(job_id=job_id, time=now, node=node_name, instances=tuple(sorted(instances))))
    for pod in ours:
        incarnation = current[pod.name]
        if pod.node in lost:
            continue
        if pod.disruption:
            key = ("preempted", pod.uid)
            if key not in said_now:
                said_now.add(key)
                events.append(Preempted(job_id=job_id, time=now, round=incarnation.round,
                                        reason=disruption_text(pod)))
            continue
        if pod.exit_code is not None and pod.phase in ("Failed", "Succeeded", "Pending"):
            key = ("exited", pod.uid)
            if key not in said_now:
                said_now.add(key)
                if pod.exit_reason not in PLAIN_ENDS:
                    # What only Kubernetes knows (OOMKilled, an image it cannot pull), as the exit's last line.
                    events.append(LogLine(job_id=job_id, time=now, instance=incarnation.instance,
                                          round=incarnation.round, start=incarnation.start, stream=Stream.STDERR,
                                          text=f"trainwarden: Kubernetes ended pod {pod.name}'s container on node "
                                               f"{pod.node}: Reason: {pod.exit_reason}, Exit Code: {pod.exit_code}"))
                events.append(InstanceExited(job_id=job_id, time=now, instance=incarnation.instance,
                                             round=incarnation.round, start=incarnation.start,
                                             exit_code=pod.exit_code))
    return events, frozenset(said_now)


def current_of(current: Mapping[str, Incarnation], instance: str) -> tuple[str, int, int]:
    for incarnation in current.values():
        if incarnation.instance == instance:
            return incarnation.instance, incarnation.round, incarnation.start
    return instance, -1, -1
