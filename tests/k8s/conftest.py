"""Fixtures for tests against the real Kubernetes of deploy/k8s/local-k8s.

Opt-in: needs TRAINWARDEN_K8S=1 and KUBECONFIG (``.ci/run`` starts the
cluster and sets both; by hand: ``eval "$(deploy/k8s/local-k8s start)"`` and
``export TRAINWARDEN_K8S=1``). Nothing here starts or stops the cluster:
other sessions may share it. Each test module gets a namespace of its own
(``namespace``), deleted with everything in it at the end.

A pod of the local cluster runs the workload image, whose root is empty:
``workload_pod`` mounts /usr, this interpreter's Python install and this
repository at their own paths (hostPath, read-only) and runs this
interpreter (the repository's .venv, with trainwarden and torch).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "k8s" / "local-k8s"
NODES = ("tw-k8s-1", "tw-k8s-2")  # local-k8s's kubelets
WORKLOAD_IMAGE = "trainwarden.local/workload:1"
TEST_NAMESPACE_PREFIX = "twtest-"

HERE = Path(__file__).resolve().parent


def _why_not_here() -> str | None:
    if os.environ.get("TRAINWARDEN_K8S") != "1" or not os.environ.get("KUBECONFIG"):
        return "needs a real Kubernetes cluster: eval \"$(deploy/k8s/local-k8s start)\" and TRAINWARDEN_K8S=1"
    try:
        import lightkube  # noqa: F401
    except ImportError:
        return "lightkube is not installed here (pip install -e '.[kubernetes]')"
    return None


SKIP_REASON = _why_not_here()

if SKIP_REASON is None:
    from lightkube import Client, KubeConfig, codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of tests/k8s skips, saying why, without the cluster (a conftest's pytestmark would not reach them)."""
    if SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


def local_k8s_dir() -> Path | None:
    """The state dir of the local-k8s cluster KUBECONFIG points at, if it is one."""
    kubeconfig = Path(os.environ.get("KUBECONFIG", "")).resolve()
    candidate = kubeconfig.parent.parent
    return candidate if (candidate / ".local-k8s").is_file() else None


def pod_logs_dir(node: str) -> Path | None:
    """NODE's /var/log/pods on the local cluster (one directory per kubelet)."""
    state = local_k8s_dir()
    return state / "pod-logs" / node if state else None


@pytest.fixture(scope="session")
def k8s() -> Iterator[Client]:
    """A client of the cluster KUBECONFIG names (the local cluster's admin)."""
    client = Client(KubeConfig.from_file(os.environ["KUBECONFIG"]), field_manager="trainwarden-tests")
    try:
        names = sorted(node.metadata.name for node in client.list(Node))
    except Exception as e:  # noqa: BLE001 - any failure here means the cluster is not usable
        pytest.fail(f"TRAINWARDEN_K8S=1 but the apiserver of {os.environ['KUBECONFIG']} does not answer: {e}")
    assert names == list(NODES), f"these tests expect local-k8s's nodes {NODES}, the cluster has {names}"
    yield client
    client.close()


@pytest.fixture(scope="module")
def namespace(k8s: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for this test module, with its default ServiceAccount (pods need it)."""
    module = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")[:30].strip("-")
    name = f"{TEST_NAMESPACE_PREFIX}{uuid.uuid4().hex[:6]}-{module}"
    k8s.create(Namespace(metadata=ObjectMeta(name=name, labels={"trainwarden.io/test": "true"})))
    wait_until(lambda: _exists(k8s, ServiceAccount, "default", name), 60, f"the default ServiceAccount of {name}")
    yield name
    for pod in k8s.list(Pod, namespace=name):
        _delete_quietly(k8s, Pod, pod.metadata.name, name, grace_period=0)
    _delete_quietly(k8s, Namespace, name)


def _exists(k8s: Client, kind, name: str, namespace: str | None = None) -> bool:
    try:
        k8s.get(kind, name, namespace=namespace)
        return True
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise


def _delete_quietly(k8s: Client, kind, name: str, namespace: str | None = None, **options) -> None:
    try:
        k8s.delete(kind, name, namespace=namespace, **options)
    except ApiError as e:
        if e.status.code != 404:
            raise


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll CONDITION (an API read) until it is truthy; fail naming WHAT."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)


def wait_for_pod(k8s: Client, name: str, namespace: str, condition: Callable[[Pod], bool], timeout_s: float = 90) -> Pod:
    """Read pod NAME until CONDITION holds for it; fail with its last status.

    Reads, not a watch: lightkube's watch reconnects forever and yields
    nothing while nothing changes, so it cannot keep a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        pod = k8s.get(Pod, name, namespace=namespace)
        if condition(pod):
            return pod
        if time.monotonic() > deadline:
            pytest.fail(f"pod {namespace}/{name}: condition not met within {timeout_s:.0f} s; last status {pod.status}")
        time.sleep(0.2)


def pod_is_running(pod: Pod) -> bool:
    statuses = (pod.status and pod.status.containerStatuses) or []
    return pod.status.phase == "Running" and bool(statuses) and all(s.state.running for s in statuses)


def pod_has_ended(pod: Pod) -> bool:
    return bool(pod.status) and pod.status.phase in ("Succeeded", "Failed")


def workload_mounts() -> list[str]:
    """What a workload pod mounts at its own path: /usr, this Python's install, this repository."""
    paths = ["/usr", sys.base_prefix, str(ROOT)]
    return [p for i, p in enumerate(paths) if p not in paths[:i] and not any(p.startswith(q + "/") for q in paths[:i])]


def workload_pod(name: str, script: str, *, node: str | None = None, labels: dict[str, str] | None = None,
                 restart_policy: str = "Never") -> Pod:
    """A pod that runs SCRIPT with this repository's Python on the workload image (hostNetwork, as every pod here)."""
    mounts = workload_mounts()
    spec: dict = {
        "hostNetwork": True,
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "main",
            "image": WORKLOAD_IMAGE,
            "imagePullPolicy": "Never",
            "command": [sys.executable, "-u", "-c", script],
            "volumeMounts": [{"name": f"host-{i}", "mountPath": p, "readOnly": True} for i, p in enumerate(mounts)],
        }],
        "volumes": [{"name": f"host-{i}", "hostPath": {"path": p, "type": "Directory"}} for i, p in enumerate(mounts)],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec})
