"""The local cluster is a real one: kubelets on containerd and runc, two
nodes, pods running this repository's Python with torch, the pods' logs
through the API and in the kubelets' CRI log files, their processes on this
host under their real PIDs.

Opt-in (see conftest.py). The last test starts a second cluster of its own
(another K8S_DIR and port base; the shared one is untouched), kills and
restarts one of its kubelets, and stops it: only with
TRAINWARDEN_K8S_STOP_TEST=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.k8s.conftest import (
    SKIP_REASON,
    NODES,
    SCRIPT,
    local_k8s_dir,
    pod_has_ended,
    pod_is_running,
    pod_logs_dir,
    wait_for_pod,
    wait_until,
    workload_pod,
)

if SKIP_REASON is None:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node, Pod


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_the_nodes_are_kubelets_of_kubernetes_1_34_on_containerd_and_ready(k8s):
    for node in k8s.list(Node):
        info = node.status.nodeInfo
        assert info.kubeletVersion == "v1.34.4", node.metadata.name
        assert info.containerRuntimeVersion.startswith("containerd://"), info.containerRuntimeVersion
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", f"{node.metadata.name} is not Ready"
        assert node.metadata.labels.get("trainwarden/agent") == "true", node.metadata.name


@pytest.mark.parametrize("node", NODES)
def test_a_pod_on_each_node_runs_the_repositorys_python_and_imports_torch_and_trainwarden(k8s, namespace, node):
    name = _name("torch")
    script = (
        "import torch, trainwarden, os\n"
        "print('torch', torch.__version__, 'sum', int(torch.arange(4).sum()))\n"
        "print('trainwarden', os.path.dirname(trainwarden.__file__))\n"
    )
    k8s.create(workload_pod(name, script, node=node), namespace=namespace)
    pod = wait_for_pod(k8s, name, namespace, pod_has_ended, timeout_s=120)
    logs = "".join(k8s.log(name, namespace=namespace))
    assert pod.status.phase == "Succeeded", logs
    assert pod.spec.nodeName == node
    assert re.search(r"^torch \d+\.\d+\S* sum 6$", logs, re.M), logs
    assert f"trainwarden {Path(__file__).resolve().parents[2] / 'pipeline' / 'trainwarden'}" in logs


def test_a_running_pods_lines_are_in_the_api_and_its_nodes_cri_log_file_and_its_process_on_this_host(k8s, namespace):
    name, node = _name("lines"), NODES[1]
    marker = uuid.uuid4().hex
    script = (
        "import sys, time\n"
        "for i in range(3): print(f'line {i}', flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        f"time.sleep(600)  # {marker}\n"
    )
    k8s.create(workload_pod(name, script, node=node), namespace=namespace)
    pod = wait_for_pod(k8s, name, namespace, pod_is_running)
    # stdout and stderr are two pipes read apart: their lines interleave by time only.
    expected = ["line 0", "line 1", "line 2", "to stderr"]
    wait_until(lambda: sorted("".join(k8s.log(name, namespace=namespace)).splitlines()) == expected, 30,
               f"the pod's lines {expected} through the API")

    # The kubelet's CRI log file, as an agent on the node reads it from /var/log/pods.
    logs_dir = pod_logs_dir(node)
    if logs_dir is not None:
        (log_file,) = (logs_dir / f"{namespace}_{name}_{pod.metadata.uid}" / "main").glob("*.log")
        records = log_file.read_text().splitlines()
        assert sorted(r.split(" ", 1)[1] for r in records) == [
            "stderr F to stderr", "stdout F line 0", "stdout F line 1", "stdout F line 2"], records
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", r.split(" ", 1)[0]) for r in records), records

    # A real container: its process runs on this host, in the container's cgroup.
    container_id = pod.status.containerStatuses[0].containerID.split("://", 1)[1]
    pids = [p for p in _pids_with_cmdline(marker) if container_id in _read(f"/proc/{p}/cgroup")]
    assert len(pids) == 1, f"the pod's python among this host's processes: {pids}"


def test_a_pod_evicted_through_the_eviction_api_is_marked_as_a_disruption_target_before_it_goes(k8s, namespace):
    """What the kubernetes runtime reads as a preemption, not a fault (issue 24)."""
    name = _name("evicted")
    script = "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: exit(143))\ntime.sleep(600)\n"
    k8s.create(workload_pod(name, script, node=NODES[0]), namespace=namespace)
    wait_for_pod(k8s, name, namespace, pod_is_running)
    k8s.create(Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace)), name, namespace=namespace)

    def disruption(pod) -> bool:
        return any(c.type == "DisruptionTarget" and c.status == "True" for c in pod.status.conditions or [])

    pod = wait_for_pod(k8s, name, namespace, disruption, timeout_s=30)
    (condition,) = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert condition.reason == "EvictionByEvictionAPI"
    assert pod.metadata.deletionTimestamp is not None


def test_local_k8s_status_says_the_cluster_and_both_nodes_run():
    state = local_k8s_dir()
    if state is None:
        pytest.skip("KUBECONFIG is not a deploy/k8s/local-k8s cluster's")
    done = subprocess.run([str(SCRIPT), "status"], env={**os.environ, "K8S_DIR": str(state)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"local-k8s: running in {state}" in done.stdout
    for node in NODES:
        assert re.search(rf"^{node}\s+Ready\s", done.stdout, re.M), done.stdout
    assert "not running:" not in done.stdout, done.stdout


@pytest.mark.skipif(os.environ.get("TRAINWARDEN_K8S_STOP_TEST") != "1",
                    reason="starts and stops a second local cluster (~1 min): set TRAINWARDEN_K8S_STOP_TEST=1")
def test_kill_node_makes_a_node_not_ready_restart_node_returns_it_and_stop_leaves_nothing_behind():
    port_base = int(os.environ.get("TRAINWARDEN_K8S_STOP_TEST_PORT_BASE", "16700"))
    with tempfile.TemporaryDirectory(prefix="trainwarden-k8s-stoptest-") as tmp:
        env = {**os.environ, "K8S_DIR": f"{tmp}/k8s", "K8S_PORT_BASE": str(port_base)}
        started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=600)
        try:
            assert started.returncode == 0, started.stderr
            kubeconfig = started.stdout.strip().removeprefix("export KUBECONFIG=")
            _run_a_pod_on_each_node(kubeconfig)
            _lose_and_regain_a_node(env, kubeconfig, NODES[1])
        finally:
            stopped = subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=300)
        assert stopped.returncode == 0, stopped.stderr
        state = f"{tmp}/k8s/"
        assert not [line for line in Path("/proc/mounts").read_text().splitlines() if f" {state}" in line]
        assert not _pids_with_environ(f"TRAINWARDEN_LOCAL_K8S={tmp}/k8s")
        cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/trainwarden-k8s-{port_base}-*")]
        assert not cgroups, cgroups
        status = subprocess.run([str(SCRIPT), "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 1 and "not running" in status.stdout, status.stdout


def _run_a_pod_on_each_node(kubeconfig: str) -> None:
    """Pods with volumes (mounts, cgroups, shims) for stop to clean up: left running."""
    from lightkube import Client, KubeConfig

    client = Client(KubeConfig.from_file(kubeconfig), field_manager="trainwarden-tests")
    for node in NODES:
        client.create(workload_pod(f"left-{node}", "import time; time.sleep(600)", node=node), namespace="default")
    for node in NODES:
        wait_for_pod(client, f"left-{node}", "default", pod_is_running)
    client.close()


def _lose_and_regain_a_node(env: dict[str, str], kubeconfig: str, node: str) -> None:
    """kill-node: the kubelet dies, the node goes NotReady (K8S_NODE_GRACE); restart-node: Ready again."""
    from lightkube import Client, KubeConfig

    client = Client(KubeConfig.from_file(kubeconfig))

    def ready() -> str:
        return {c.type: c.status for c in client.get(Node, node).status.conditions}["Ready"]

    killed = subprocess.run([str(SCRIPT), "kill-node", node], env=env, capture_output=True, text=True, timeout=30)
    assert killed.returncode == 0, killed.stderr
    wait_until(lambda: ready() != "True", 60, f"{node} NotReady after its kubelet was killed")
    restarted = subprocess.run([str(SCRIPT), "restart-node", node], env=env, capture_output=True, text=True, timeout=200)
    assert restarted.returncode == 0, restarted.stderr
    assert ready() == "True"
    client.close()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _pids_with_cmdline(text: str) -> list[int]:
    me = os.getpid()
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and int(p.name) != me and text in _read(f"{p}/cmdline")]


def _pids_with_environ(entry: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if entry.encode() + b"\0" in (p / "environ").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
    return found

