"""deploy/k8s on the real local cluster: every object of the kustomization
passes the apiserver's validation and admission (a server-side dry run);
the actuator's ServiceAccount, applied for real, may use exactly the verbs
of the kubernetes runtime and is refused the rest, both by the authorizer
(SubjectAccessReview) and on a real request with its own token; the agent
DaemonSet runs ``trainwarden agent`` on both nodes with the privileges it
asks for (the host's PIDs, SYS_PTRACE, the pod logs read-only).

The namespaces, the ServiceAccount and its roles stay applied (they are the
deployment's own, and what a runtime test on the cluster runs with); the
agent DaemonSet runs in the module's namespace and goes with it.

Opt-in (see conftest.py); the DaemonSet test also needs TRAINWARDEN_KAFKA.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.k8s.conftest import (
    SKIP_REASON,
    NODES,
    ROOT,
    WORKLOAD_IMAGE,
    local_k8s_dir,
    pod_is_running,
    wait_until,
    workload_mounts,
)

K8S = ROOT / "deploy" / "k8s"
SERVICE_ACCOUNT = ("trainwarden", "trainwarden-actuator")
JOBS_NAMESPACE = "trainwarden-jobs"
CAP_SYS_PTRACE = 19

if SKIP_REASON is None:
    from lightkube import Client, KubeConfig, codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.authorization_v1 import SubjectAccessReview
    from lightkube.resources.core_v1 import Pod, Secret, ServiceAccount


def kustomization_objects() -> list[dict]:
    """The objects `kubectl kustomize deploy/k8s` makes (its resources, its image mapping)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "images"}, "mapped here by hand: keep in step"
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in kustomization.get("images", [])}
    objects = []
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / resource).read_text()):
            if doc:
                for container in _pod_template_containers(doc):
                    name = container["image"].rsplit(":", 1)[0]
                    container["image"] = images.get(name, container["image"])
                objects.append(doc)
    return objects


def _pod_template_containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("initContainers", []) + spec.get("containers", [])


def _apply_for_real(k8s, kinds: set[str]) -> None:
    for doc in kustomization_objects():
        if doc["kind"] in kinds:
            k8s.apply(codecs.from_dict(doc), force=True)


def test_every_object_of_the_kustomization_passes_a_server_side_dry_run(k8s):
    objects = kustomization_objects()
    # A dry run of a namespaced object needs its namespace to exist.
    _apply_for_real(k8s, {"Namespace"})
    refused = []
    for doc in objects:
        try:
            k8s.apply(codecs.from_dict(doc), force=True, dry_run=True)
        except ApiError as e:
            refused.append(f"{doc['kind']} {doc['metadata']['name']}: {e.status.message}")
    assert not refused, refused
    assert {d["kind"] for d in objects} >= {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                           "ClusterRoleBinding", "DaemonSet", "Deployment"}


# (verb, resource, subresource, namespace) -> allowed for the actuator's ServiceAccount
ACCESS = [
    ("create", "pods", "", JOBS_NAMESPACE, True),
    ("get", "pods", "", JOBS_NAMESPACE, True),
    ("list", "pods", "", JOBS_NAMESPACE, True),
    ("watch", "pods", "", JOBS_NAMESPACE, True),
    ("patch", "pods", "", JOBS_NAMESPACE, True),
    ("delete", "pods", "", JOBS_NAMESPACE, True),
    ("patch", "pods", "status", JOBS_NAMESPACE, True),  # a spot release's DisruptionTarget
    ("create", "events", "", JOBS_NAMESPACE, True),
    ("get", "nodes", "", "", True),
    ("list", "nodes", "", "", True),
    ("watch", "nodes", "", "", True),
    ("patch", "nodes", "", "", True),
    # refused
    ("create", "pods", "eviction", JOBS_NAMESPACE, False),
    ("create", "pods", "exec", JOBS_NAMESPACE, False),
    ("get", "pods", "log", JOBS_NAMESPACE, False),
    ("get", "secrets", "", JOBS_NAMESPACE, False),
    ("list", "secrets", "", "trainwarden", False),
    ("create", "pods", "", "trainwarden", False),
    ("create", "pods", "", "default", False),
    ("list", "pods", "", "", False),
    ("update", "pods", "", JOBS_NAMESPACE, False),
    ("update", "pods", "status", JOBS_NAMESPACE, False),
    ("patch", "pods", "status", "default", False),
    ("delete", "nodes", "", "", False),
    ("update", "nodes", "", "", False),
    ("patch", "nodes", "status", "", False),
    ("create", "serviceaccounts", "token", "trainwarden", False),
    ("create", "rolebindings", "", JOBS_NAMESPACE, False),
]


def _allowed(k8s, verb: str, resource: str, subresource: str, namespace: str) -> bool:
    group = "rbac.authorization.k8s.io" if resource == "rolebindings" else ""
    review = SubjectAccessReview(spec=SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{SERVICE_ACCOUNT[0]}:{SERVICE_ACCOUNT[1]}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{SERVICE_ACCOUNT[0]}", "system:authenticated"],
        resourceAttributes=ResourceAttributes(verb=verb, resource=resource, subresource=subresource or None,
                                              namespace=namespace or None, group=group),
    ))
    return bool(k8s.create(review).status.allowed)


def test_the_actuators_service_account_may_use_exactly_the_runtimes_verbs(k8s):
    _apply_for_real(k8s, {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})
    # The authorizer's cache follows new bindings within moments, each binding on its own.
    wait_until(lambda: _allowed(k8s, "create", "pods", "", JOBS_NAMESPACE), 30, "the actuator's RoleBinding in effect")
    wait_until(lambda: _allowed(k8s, "get", "nodes", "", ""), 30, "the actuator's ClusterRoleBinding in effect")
    wrong = [f"{'refused' if allowed else 'allowed'}: {verb} {resource}{'/' + sub if sub else ''} in {ns or 'the cluster'}"
             for verb, resource, sub, ns, allowed in ACCESS if _allowed(k8s, verb, resource, sub, ns) != allowed]
    assert not wrong, wrong


def test_a_request_with_the_actuators_own_token_is_refused_a_verb_it_lacks(k8s):
    _apply_for_real(k8s, {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})
    token = k8s.create(ServiceAccount.Token(metadata=ObjectMeta(), spec=TokenRequestSpec(audiences=[], expirationSeconds=600)),
                       SERVICE_ACCOUNT[1], namespace=SERVICE_ACCOUNT[0]).status.token
    admin = KubeConfig.from_file(os.environ["KUBECONFIG"])
    cluster = admin.clusters[admin.contexts[admin.current_context].cluster]
    config = KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "actuator",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server,
                                               "certificate-authority": cluster.certificate_auth}}],
        "users": [{"name": "actuator", "user": {"token": token}}],
        "contexts": [{"name": "actuator", "context": {"cluster": "c", "user": "actuator"}}],
    })
    actuator = Client(config)
    try:
        wait_until(lambda: list(actuator.list(Pod, namespace=JOBS_NAMESPACE)) is not None, 30, "a pod listing as the actuator")
        with pytest.raises(ApiError) as refused:
            list(actuator.list(Secret, namespace=JOBS_NAMESPACE))
        assert refused.value.status.code == 403
        with pytest.raises(ApiError) as refused:
            list(actuator.list(Pod, namespace="trainwarden"))
        assert refused.value.status.code == 403
        assert "cannot list resource \"pods\"" in refused.value.status.message
    finally:
        actuator.close()


def _local_agent_daemonset(namespace: str, kafka: str, topic_prefix: str, state_dir: Path) -> dict:
    """deploy/k8s's agent DaemonSet as it can run on the local cluster, its privileges untouched.

    What changes: the namespace; the workload image and this repository's
    Python (mounted from the host); a plaintext Kafka of the tests' own topic
    prefix instead of the SASL_SSL one and its Secrets; no metrics listener
    (both nodes share this host's network: two agents cannot both have
    :9464) and so no probes; the kubelet's pod logs, one directory per node
    here, mounted at /var/log/pods by the node's name."""
    (daemonset,) = [copy.deepcopy(d) for d in kustomization_objects() if d["kind"] == "DaemonSet"
                    and d["metadata"]["name"] == "trainwarden-agent"]
    daemonset["metadata"]["namespace"] = namespace
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    container["image"], container["imagePullPolicy"] = WORKLOAD_IMAGE, "Never"
    container["command"] = [sys.executable, "-m", "trainwarden.cli.main"]
    container["args"] = ["agent", "--node", "$(TRAINWARDEN_NODE)", "--address", "$(TRAINWARDEN_ADDRESS)",
                         "--slots", "2", "--bootstrap", kafka, "--log-dir", "/var/log/trainwarden"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe", "ports"):
        container.pop(probe, None)
    container["env"] = [e for e in container["env"] if "configMapKeyRef" not in e.get("valueFrom", {})]
    container["env"].append({"name": "TRAINWARDEN_TOPIC_PREFIX", "value": topic_prefix})
    secrets = {v["name"] for v in spec["volumes"] if "secret" in v}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in secrets]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in secrets]
    for volume in spec["volumes"]:
        if volume["name"] == "logs":
            volume.pop("hostPath")
            volume["emptyDir"] = {}
        if volume["name"] == "pod-logs":
            volume["hostPath"] = {"path": str(state_dir / "pod-logs"), "type": "Directory"}
    for mount in container["volumeMounts"]:
        if mount["mountPath"] == "/var/log/pods":
            mount["subPathExpr"] = "$(TRAINWARDEN_NODE)"
    for i, path in enumerate(workload_mounts()):
        spec["volumes"].append({"name": f"host-{i}", "hostPath": {"path": path, "type": "Directory"}})
        container["volumeMounts"].append({"name": f"host-{i}", "mountPath": path, "readOnly": True})
    return daemonset


def _host_pid_of(container_id: str) -> int:
    """The host PID of a container's first process (hostPID: the same PID namespace)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if container_id in (proc / "cgroup").read_text():
                    pids.append(int(proc.name))
            except OSError:
                pass
    assert pids, f"no process of container {container_id} on this host"
    return min(pids)


def test_the_agent_daemonset_runs_trainwarden_agent_on_both_nodes_with_host_pids_ptrace_and_read_only_pod_logs(
        k8s, namespace):
    kafka = os.environ.get("TRAINWARDEN_KAFKA")
    state = local_k8s_dir()
    if not kafka:
        pytest.skip("the agent needs Kafka: set TRAINWARDEN_KAFKA (CI does)")
    if state is None:
        pytest.skip("KUBECONFIG is not a deploy/k8s/local-k8s cluster's (its pod logs are mounted per node)")
    prefix = f"twtest-k8s-{uuid.uuid4().hex[:6]}"
    # The agent refuses to start on topics that do not exist: made first, as an operator's kafka init does.
    subprocess.run([sys.executable, "-m", "trainwarden.cli.main", "kafka", "init", "--partitions", "1",
                    "--bootstrap", kafka], env={**os.environ, "TRAINWARDEN_TOPIC_PREFIX": prefix}, check=True,
                   capture_output=True, timeout=60)
    k8s.create(codecs.from_dict(_local_agent_daemonset(namespace, kafka, prefix, state)))
    label = "app.kubernetes.io/component=agent"

    def running_per_node():
        pods = [p for p in k8s.list(Pod, namespace=namespace, labels={"app.kubernetes.io/component": "agent"})]
        return {p.spec.nodeName: p for p in pods if pod_is_running(p)} if len(pods) == len(NODES) else None

    pods = wait_until(lambda: (r := running_per_node()) and len(r) == len(NODES) and r, 120,
                      f"agent pods ({label}) running on both nodes")
    assert sorted(pods) == list(NODES)
    my_pid_namespace = os.readlink("/proc/self/ns/pid")
    for node, pod in pods.items():
        pid = _host_pid_of(pod.status.containerStatuses[0].containerID.split("://", 1)[1])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"agent" in cmdline and b"trainwarden.cli.main" in cmdline, cmdline
        assert os.readlink(f"/proc/{pid}/ns/pid") == my_pid_namespace, "hostPID: the host's PID namespace"
        status = Path(f"/proc/{pid}/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
        assert effective >> CAP_SYS_PTRACE & 1, "SYS_PTRACE (py-spy) in the agent's effective capabilities"
        (pod_logs,) = [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                       if line.split()[4] == "/var/log/pods"]
        assert "ro" in pod_logs[5].split(","), pod_logs
        # Its node's pod logs, its own pod's among them, and no other node's.
        seen = set(os.listdir(f"/proc/{pid}/root/var/log/pods"))
        assert f"{namespace}_{pod.metadata.name}_{pod.metadata.uid}" in seen
        others = {f"{namespace}_{p.metadata.name}_{p.metadata.uid}" for n, p in pods.items() if n != node}
        assert not seen & others
    k8s.delete(DaemonSet, "trainwarden-agent", namespace=namespace)
