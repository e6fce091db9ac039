"""What the runtime asks the apiserver for, as plain data: one pod per
instance, and the patches that isolate and return a node. Pure: no client,
no clock; every value comes in as an argument (the API's JSON shapes, so any
client library sends them as they are).

A pod outlives the job's restarts: its container runs the pod host
(pod_host.py), which runs one incarnation after the other in place, as the
node's agent says (round, start, token, the round's port: what changes per
incarnation arrives with each ``run``, never in the pod's spec, so no token
is readable by whoever can read pods). The pod's own environment holds what
stays: the job, the instance and its rank, the rank-0 pod's address
(``MASTER_ADDR``, fixed while that pod lives), the node's name (downward
API), the SDK's import directory and where the agent's addresses are.
"""

from __future__ import annotations

import hashlib
import re
from typing import Mapping, Optional, Sequence

from trainwarden.events import InstanceSpec
from trainwarden.runtime.kubernetes.section import ISOLATED_TAINT, KubernetesSection

GROUP = "trainwarden.io"
JOB_LABEL = f"{GROUP}/job"
ROLE_LABEL = f"{GROUP}/role"
INDEX_LABEL = f"{GROUP}/index"
ROUND_LABEL = f"{GROUP}/round"  # the round the pod was created for
JOB_ID_ANNOTATION = f"{GROUP}/job-id"  # the job id in full (a label value is at most 63 characters)
INSTANCE_ANNOTATION = f"{GROUP}/instance"
REASON_ANNOTATION = f"{GROUP}/isolated-reason"  # on a node Trainwarden isolated
CONTAINER = "instance"
# Where the pod host keeps its socket, manifests and output, per pod uid
# (hostPath): the node's agent reads them there.
STATE_MOUNT = "/var/run/trainwarden-pods"


def label_value(text: str) -> str:
    """A label value for any job id: itself when Kubernetes allows it, else a
    readable prefix and a digest (the annotation keeps the id in full)."""
    if re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:40].strip("-_.")
    return f"{stem}-{digest}" if stem else digest


def pod_name(job_id: str, instance: str, generation: int) -> str:
    """``tw-<job>-<digest>-<instance>-<generation>``: a DNS-1123 name, unique
    per job (the digest) and per pod the instance has had (the generation:
    one more each time its pod is replaced on another node)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", job_id.lower())[:30].strip("-") or "job"
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    name = re.sub(r"[^a-z0-9-]+", "-", instance.lower()).strip("-")[:40]
    return f"tw-{stem}-{digest}-{name}-{generation}"


def job_selector(job_id: str) -> str:
    return f"{JOB_LABEL}={label_value(job_id)}"


def pod_manifest(*, job_id: str, spec: InstanceSpec, world_size: int, generation: int, round_: int,
                 section: KubernetesSection, command: Sequence[str], env: Mapping[str, str], master_addr: str,
                 master_port: int, avoid_nodes: Sequence[str] = (), host_network: bool = True,
                 state_dir: str = STATE_MOUNT, grace_s: float = 10.0, workdir: str = "", pool: str = "") -> dict:
    """One instance's pod. ``command`` runs the pod host; ``env`` is what
    every incarnation shares (environment.job_env and the static part of
    instance_env); ``avoid_nodes`` are nodes the runtime knows to be bad
    before Kubernetes does (lost, isolated a moment ago); ``pool``: the
    market pool of a spot role, whose nodes alone it runs on (pool_placement)."""
    labels = {JOB_LABEL: label_value(job_id), ROLE_LABEL: label_value(spec.role), INDEX_LABEL: str(spec.index),
              ROUND_LABEL: str(round_)}
    variables = [{"name": key, "value": value} for key, value in sorted(env.items())]
    variables += [
        {"name": "MASTER_ADDR", "value": master_addr},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "RANK", "value": str(spec.rank)},
        {"name": "WORLD_SIZE", "value": str(world_size)},
        # The node's name as the agents know it: where the job's SDK calls go.
        {"name": "TRAINWARDEN_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TRAINWARDEN_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "TRAINWARDEN_POD_STATE", "value": STATE_MOUNT},
    ]
    mounts = [{"name": "trainwarden-state", "mountPath": STATE_MOUNT}]
    volumes = [{"name": "trainwarden-state", "hostPath": {"path": state_dir, "type": "DirectoryOrCreate"}}]
    for number, host in enumerate(section.host_paths):
        volumes.append({"name": f"host-{number}", "hostPath": {"path": host.path}})
        mounts.append({"name": f"host-{number}", "mountPath": host.path, "readOnly": not host.writable})
    container: dict = {
        "name": CONTAINER, "image": section.image, "imagePullPolicy": section.image_pull_policy,
        "command": list(command), "env": variables, "volumeMounts": mounts,
    }
    if workdir:
        container["workingDir"] = workdir
    if section.resources:
        amounts = dict(section.resources)
        # Extended resources (GPUs) must have requests equal to limits; the rest is simplest alike.
        container["resources"] = {"requests": amounts, "limits": dict(amounts)}
    pod_spec: dict = {
        "containers": [container],
        # The pod host restarts the training process in place; the pod itself
        # is never restarted by the kubelet (a failed pod host is the instance's exit).
        "restartPolicy": "Never",
        "hostNetwork": host_network,
        "terminationGracePeriodSeconds": int(grace_s) + 5,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            _away_from(avoid_nodes)]}}},
        "volumes": volumes,
        # The job needs no API credentials unless its section names an account for it.
        "automountServiceAccountToken": bool(section.service_account),
    }
    if host_network:
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if section.service_account:
        pod_spec["serviceAccountName"] = section.service_account
    selector, tolerations = pool_placement(section, pool)
    if selector:
        pod_spec["nodeSelector"] = selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(job_id, spec.name, generation), "namespace": section.namespace,
                     "labels": labels,
                     "annotations": {JOB_ID_ANNOTATION: job_id, INSTANCE_ANNOTATION: spec.name}},
        "spec": pod_spec,
    }


def pool_placement(section: KubernetesSection, pool: str) -> tuple[dict, list]:
    """The pod's nodeSelector and tolerations: the section's, and for a spot
    role (``pool``) its pool's nodes: the label ``<pool_label>=<pool>`` and a
    toleration of the taint ``<pool_taint>=<pool>`` whatever its effect."""
    selector = dict(section.node_selector)
    tolerations = [t.manifest() for t in section.tolerations]
    if pool:
        selector[section.pool_label] = label_value(pool)
        if section.pool_taint:
            tolerations.append({"key": section.pool_taint, "operator": "Equal", "value": label_value(pool)})
    return selector, tolerations


# The reason of the DisruptionTarget condition a spot release puts on its pods
# before deleting them, as a cloud's spot reclaim shows on its pods.
RELEASE_REASON = "TerminationByTrainwarden"


def release_condition(message: str, now_rfc3339: str) -> dict:
    """A strategic merge patch of a pod's status: the DisruptionTarget
    condition of a spot release (conditions merge by type)."""
    return {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": RELEASE_REASON,
                                       "message": message[:1000], "lastTransitionTime": now_rfc3339}]}}


def _away_from(avoid_nodes: Sequence[str]) -> dict:
    """Off nodes Trainwarden isolated (their label; the taint keeps new pods
    off too, this makes it hold for pods that tolerate every NoSchedule) and
    off the nodes the runtime avoids by name."""
    term: dict = {"matchExpressions": [{"key": ISOLATED_TAINT, "operator": "DoesNotExist"}]}
    if avoid_nodes:
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": sorted(set(avoid_nodes))}]
    return term


def isolate_patch(reason: str) -> dict:
    """Cordon, and say so where Kubernetes and people look: the taint
    (NoSchedule: running pods stay until the engine moves them), the label
    (for the pods' affinity and ``kubectl get nodes -l``), the reason."""
    return {"spec": {"unschedulable": True},
            "metadata": {"labels": {ISOLATED_TAINT: "true"}, "annotations": {REASON_ANNOTATION: reason[:1000]}}}


def with_isolation_taint(taints: Optional[Sequence[Mapping]], reason: str) -> list:
    """The node's taints with Trainwarden's added once (a merge patch replaces the whole list)."""
    kept = [dict(t) for t in taints or () if t.get("key") != ISOLATED_TAINT]
    return kept + [{"key": ISOLATED_TAINT, "value": "true", "effect": "NoSchedule"}]


def uncordon_patch(taints: Optional[Sequence[Mapping]]) -> dict:
    """Undo isolate_patch: uncordon, drop Trainwarden's taint, label and reason; other taints stay."""
    return {"spec": {"unschedulable": False, "taints": [dict(t) for t in taints or () if t.get("key") != ISOLATED_TAINT]},
            "metadata": {"labels": {ISOLATED_TAINT: None}, "annotations": {REASON_ANNOTATION: None}}}


def eviction(name: str, namespace: str) -> dict:
    """An Eviction (policy/v1) of one pod: what ``kubectl drain`` sends."""
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
