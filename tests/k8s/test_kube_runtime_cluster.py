"""The kubernetes runtime against the real local cluster (deploy/k8s/local-k8s):
real pods on real kubelets, the pod hosts driven from this machine as the
node's agent drives them (node_side.PodHosts: the kubelets run here), the
API's own cordon, taint and Eviction. Opt in with TRAINWARDEN_K8S=1 and
KUBECONFIG; skipped, saying why, otherwise."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from tests.k8s.runtime_fixtures import kube_runtime
from trainwarden.classify import classify
from trainwarden.events import (InstanceExited, InstanceSpec, InstanceStarted, JobSpec, LogLine, NodeLost, Preempted,
                                RoleSpec)
from trainwarden.rules.loader import load_rules
from trainwarden.runtime.kubernetes.api import KubeApi
from trainwarden.runtime.kubernetes.manifests import job_selector
from trainwarden.runtime.kubernetes.node_side import PodHosts
from trainwarden.runtime.kubernetes.drivers import LocalPodDriver
from trainwarden.runtime.kubernetes.runtime import KubeSite, uncordon
from trainwarden.runtime.kubernetes.section import HostPath, KubernetesSection

pytestmark = pytest.mark.skipif(
    not (os.environ.get("TRAINWARDEN_K8S") == "1" and os.environ.get("KUBECONFIG")),
    reason="needs the real local cluster: eval \"$(deploy/k8s/local-k8s start)\" and TRAINWARDEN_K8S=1")

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "trainwarden.local/workload:1"
INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))
# Prints its round and a line a second; exits 0 after 60 s (a round is always stopped first).
TRAIN = ("import os, time\n"
         "print('round', os.environ['TRAINWARDEN_RESTART_ROUND'], 'rank', os.environ['RANK'], flush=True)\n"
         "for _ in range(600): time.sleep(0.1)\n")


@pytest.fixture(scope="module")
def api():
    return KubeApi.connect(os.environ["KUBECONFIG"])


@pytest.fixture
def namespace(api):
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, ServiceAccount

    name = f"twtest-{uuid.uuid4().hex[:6]}-runtime"
    api.client.create(Namespace(metadata=ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(True for _ in api.client.list(ServiceAccount, namespace=name)):
            break
        time.sleep(0.2)
    yield name
    api.client.delete(Namespace, name)


@pytest.fixture
def job(api, namespace):
    state = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))  # short: the pod hosts' sockets are in it
    paths = {"/usr", sys.base_prefix, str(ROOT)}
    section = KubernetesSection(image=IMAGE, namespace=namespace, image_pull_policy="Never",
                                host_paths=tuple(HostPath(p) for p in sorted(paths)))
    spec = JobSpec(roles=(RoleSpec("worker", 2, (sys.executable, "-u", "-c", TRAIN)),), runtime="kubernetes",
                   stop_grace_s=3.0, runtime_options=json.dumps({"kubernetes": section.to_wire()}))
    site = KubeSite(api=api, driver=LocalPodDriver(PodHosts(state, "", time.monotonic)),
                    python=sys.executable, state_dir=str(state), rendezvous_by_name=True)
    runtime, heard = kube_runtime(site, f"kjob-{uuid.uuid4().hex[:6]}", spec, INSTANCES)
    # What it says: the engine's events in the list (each with when, .at); its errors beside.
    yield runtime, heard, heard
    runtime.finish()
    site.close()
    for node in ("tw-k8s-1", "tw-k8s-2"):
        uncordon(api, node)
    shutil.rmtree(state, ignore_errors=True)


def _pump(runtime, events, done, timeout=90.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events.poll()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s; events: {events[-10:]}; "
                         f"errors: {runtime.errors} {runtime.last_error}")


def _round(runtime, events, round_):
    for spec in INSTANCES:
        runtime.start(spec.name, round_, 0)
    _pump(runtime, events, lambda: {(e.instance, e.text.split()[1]) for e in events if isinstance(e, LogLine)
                                    and e.round == round_ and e.text.startswith("round")} ==
          {(s.name, str(round_)) for s in INSTANCES}, what=f"round {round_}'s first lines")


def _pods(api, runtime):
    return {p["metadata"]["annotations"]["trainwarden.io/instance"]: p
            for p in api.pods(runtime.section.namespace, job_selector(runtime.job_id))
            if not p["metadata"].get("deletionTimestamp")}


def test_a_restart_runs_in_the_same_pods_and_the_node_side_adopts_each_incarnation_by_proof(api, job):
    runtime, events, port = job
    _round(runtime, events, 0)
    before = {name: pod["metadata"]["uid"] for name, pod in _pods(api, runtime).items()}
    started = [e for e in events if isinstance(e, InstanceStarted)]
    assert len(started) == 2 and all(e.pid > 0 for e in started)  # the host pid, proven
    assert all(b"TRAINWARDEN_TOKEN=" in Path(f"/proc/{e.pid}/environ").read_bytes() for e in started)
    runtime.stop([s.name for s in INSTANCES])
    _pump(runtime, events, lambda: sum(isinstance(e, InstanceExited) for e in events) == 2, what="the stops")
    t0 = time.monotonic()
    _round(runtime, events, 1)
    in_place_s = time.monotonic() - t0
    after = {name: pod["metadata"]["uid"] for name, pod in _pods(api, runtime).items()}
    assert after == before and runtime.in_place == 2 and runtime.recreated == 0
    print(f"in-place restart: stop to both ranks' first line {in_place_s:.2f} s")


def test_isolating_a_node_cordons_and_taints_it_and_the_next_round_runs_on_the_other(api, job):
    runtime, events, port = job
    _round(runtime, events, 0)
    node = _pods(api, runtime)["worker-0"]["spec"]["nodeName"]
    runtime.isolate_node(node, "C4D: NCCL error on rank 0")
    real = api.node(node)
    assert real["spec"]["unschedulable"] is True
    assert {"key": "trainwarden.io/isolated", "value": "true", "effect": "NoSchedule"} in real["spec"]["taints"]
    assert real["metadata"]["annotations"]["trainwarden.io/isolated-reason"] == "C4D: NCCL error on rank 0"
    runtime.stop([s.name for s in INSTANCES])
    _round(runtime, events, 1)
    assert node not in {pod["spec"]["nodeName"] for pod in _pods(api, runtime).values()}
    assert uncordon(api, node) is True
    back = api.node(node)
    assert not back["spec"].get("unschedulable") and not any(
        t["key"] == "trainwarden.io/isolated" for t in back["spec"].get("taints") or ())


def test_a_pod_evicted_through_the_eviction_api_is_a_preemption(api, job):
    runtime, events, port = job
    _round(runtime, events, 0)
    pod = _pods(api, runtime)["worker-1"]["metadata"]["name"]
    api.evict(pod, runtime.section.namespace)
    _pump(runtime, events, lambda: any(isinstance(e, Preempted) for e in events), what="the preemption")
    preempted = [e for e in events if isinstance(e, Preempted)]
    assert len(preempted) == 1 and preempted[0].round == 0 and "Eviction API" in preempted[0].reason
    # The kubelet's SIGTERM ends the evicted incarnation (143): the engine holds such a death for
    # platform_notice_window_s (5 s) so that the notice decides; the notice comes well within it.
    _pump(runtime, events, lambda: any(isinstance(e, InstanceExited) and e.instance == "worker-1" for e in events),
          what="the evicted incarnation's exit")
    exit_at = next(at for e, at in zip(events, events.at) if isinstance(e, InstanceExited) and e.instance == "worker-1")
    notice_at = next(at for e, at in zip(events, events.at) if isinstance(e, Preempted))
    assert [e.exit_code for e in events if isinstance(e, InstanceExited) and e.instance == "worker-1"] == [143]
    assert abs(notice_at - exit_at) < 5.0, (notice_at - exit_at)
    print(f"eviction: notice {notice_at - exit_at:+.2f} s from the evicted incarnation's exit")


def test_a_pod_evicted_and_gone_before_the_runtime_looks_again_is_still_a_preemption(api, job):
    """The evicted pod's container ends within a second and the pod is
    deleted soon after: a runtime that only listed pods now and then saw
    nothing of it but a vanished pod (and the job's crash). The watch
    keeps the pod's last state, DisruptionTarget included."""
    runtime, events, _ = job
    _round(runtime, events, 0)
    pod = _pods(api, runtime)["worker-1"]["metadata"]["name"]
    api.evict(pod, runtime.section.namespace)
    deadline = time.monotonic() + 60
    while any(p["metadata"]["name"] == pod for p in api.pods(runtime.section.namespace, job_selector(runtime.job_id))):
        assert time.monotonic() < deadline, f"pod {pod} was not deleted within 60 s of its eviction"
        time.sleep(0.1)  # the runtime does not look meanwhile
    _pump(runtime, events, lambda: any(isinstance(e, Preempted) for e in events), timeout=10, what="the preemption")
    [preempted] = [e for e in events if isinstance(e, Preempted)]
    assert preempted.round == 0 and "Eviction API" in preempted.reason, preempted


def test_a_job_that_ends_leaves_no_pod_behind(api, job):
    runtime, events, port = job
    _round(runtime, events, 0)
    runtime.finish()
    deadline = time.monotonic() + 60
    while api.pods(runtime.section.namespace, job_selector(runtime.job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.pods(runtime.section.namespace, job_selector(runtime.job_id)) == []


def test_an_unknown_namespace_is_one_sentence_and_nothing_is_created(api, job):
    runtime, events, port = job
    runtime.section = KubernetesSection(image=IMAGE, namespace="no-such-namespace")
    runtime.start("worker-0", 0, 0)
    assert port.errors == ["the namespace 'no-such-namespace' does not exist on the cluster (hint: create it "
                           "(kubectl create namespace no-such-namespace) or fix 'kubernetes.namespace')"]
    assert runtime.pods == {}


def test_with_preload_an_in_place_restart_runs_in_a_warm_standby_of_the_pod(api, job):
    runtime, events, port = job
    runtime.spec = msgspec.structs.replace(runtime.spec, preload=("json",))
    _round(runtime, events, 0)
    runtime.stop([s.name for s in INSTANCES])
    _pump(runtime, events, lambda: sum(isinstance(e, InstanceExited) for e in events) == 2, what="the stops")
    _round(runtime, events, 1)
    second = [e for e in events if isinstance(e, InstanceStarted) and e.round == 1]
    assert len(second) == 2 and all(e.pid > 0 for e in second)
    for started in second:
        assert b"standby.py" in Path(f"/proc/{started.pid}/cmdline").read_bytes(), "not from a standby"


def test_an_incarnations_sdk_calls_reach_its_nodes_endpoint_as_the_adopted_host_process(api, namespace):
    """The SDK channel: the node's endpoint (here a Unix socket standing where
    the agent's listens) is mounted into the pod; the kernel names the caller
    by its host pid, the very process the node side adopted."""
    state = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))
    agent_dir = Path(tempfile.mkdtemp(prefix="twa-", dir="/tmp"))
    endpoint = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    endpoint.bind(str(agent_dir / "sdk.sock"))
    endpoint.listen(4)
    endpoint.settimeout(60)
    call = ("import os, socket, time\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['TRAINWARDEN_SDK_SOCKET'])\n"
            "s.sendall(b'report_progress'); print('called', flush=True); time.sleep(60)\n")
    section = KubernetesSection(image=IMAGE, namespace=namespace, image_pull_policy="Never",
                                host_paths=tuple(HostPath(p) for p in sorted({"/usr", sys.base_prefix, str(ROOT)})))
    spec = JobSpec(roles=(RoleSpec("worker", 1, (sys.executable, "-c", call)),), runtime="kubernetes",
                   stop_grace_s=2.0, runtime_options=json.dumps({"kubernetes": section.to_wire()}))
    hosts = PodHosts(state, "", time.monotonic, control_address=str(agent_dir / "sdk.sock"))
    site = KubeSite(api=api, driver=LocalPodDriver(hosts), python=sys.executable,
                    state_dir=str(state), rendezvous_by_name=True, agent_dir=str(agent_dir))
    runtime, events = kube_runtime(site, f"kjob-{uuid.uuid4().hex[:6]}", spec, INSTANCES[:1])
    try:
        runtime.start("worker-0", 0, 0)
        _pump(runtime, events, lambda: any(isinstance(e, LogLine) and e.text == "called" for e in events),
              what="the SDK call")
        conn, _ = endpoint.accept()
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
        assert conn.recv(100) == b"report_progress"
        started = [e for e in events if isinstance(e, InstanceStarted)]
        assert [e.pid for e in started] == [pid]
    finally:
        runtime.finish()
        site.close()
        endpoint.close()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(agent_dir, ignore_errors=True)


def test_an_incarnation_killed_at_its_pods_memory_limit_says_oomkilled_and_is_judged_a_memory_limit(api, namespace):
    """The kernel kills the incarnation, not the pod host (PID 1): the
    container lives on and Kubernetes reports nothing. The pod host sees
    its container's OOM kills go up and says so as the incarnation's last
    line, which the catalogue's memory-limit rule reads."""
    state = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))
    hog = "print('allocating', flush=True); x = bytearray(600 * 2**20); import time; time.sleep(60)"
    section = KubernetesSection(image=IMAGE, namespace=namespace, image_pull_policy="Never",
                                host_paths=tuple(HostPath(p) for p in sorted({"/usr", sys.base_prefix, str(ROOT)})),
                                resources=(("memory", "200Mi"),))
    spec = JobSpec(roles=(RoleSpec("worker", 1, (sys.executable, "-c", hog)),), runtime="kubernetes",
                   stop_grace_s=2.0, runtime_options=json.dumps({"kubernetes": section.to_wire()}))
    site = KubeSite(api=api, driver=LocalPodDriver(PodHosts(state, "", time.monotonic)), python=sys.executable,
                    state_dir=str(state), rendezvous_by_name=True)
    runtime, events = kube_runtime(site, f"kjob-{uuid.uuid4().hex[:6]}", spec, INSTANCES[:1])
    try:
        runtime.start("worker-0", 0, 0)
        _pump(runtime, events, lambda: any(isinstance(e, InstanceExited) for e in events), what="the OOM kill")
        [exited] = [e for e in events if isinstance(e, InstanceExited)]
        lines = [e.text for e in events if isinstance(e, LogLine)]
        assert exited.exit_code == 137 and lines[0] == "allocating", (exited, lines)
        assert "Reason: OOMKilled" in lines[-1] and "memory limit of 200 MiB" in lines[-1], lines
        verdict = classify(load_rules(), exited.exit_code, lines)
        assert (verdict.rule, verdict.verdict.value) == ("k8s_container_oom_killed", "not_retryable"), verdict
    finally:
        runtime.finish()
        site.close()
        shutil.rmtree(state, ignore_errors=True)


def test_a_hung_pods_stacks_are_dumped_from_the_node_with_py_spy_before_its_stop(api, job):
    """What the node's agent does before stopping a hung incarnation: its
    processes, found from the host by the incarnation's token (and the
    adopted pid), dumped with py-spy (diagnose/collect.py)."""
    from trainwarden.diagnose.collect import dump_instances, find_tool

    if find_tool("py-spy") is None:
        pytest.skip("py-spy is not installed here (pip install -e '.[diagnose]')")
    runtime, events, port = job
    _round(runtime, events, 0)
    started = {e.instance: e.pid for e in events if isinstance(e, InstanceStarted)}
    environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{started['worker-1']}/environ").read_bytes()
                   .split(b"\0") if b"=" in item)
    token = environ[b"TRAINWARDEN_TOKEN"].decode()
    dumps, missing = dump_instances({"worker-1": token}, ("py-spy",), 20.0, roots={"worker-1": started["worker-1"]})
    assert missing == [] and [d.pid for d in dumps] == [started["worker-1"]]
    frames = [frame for thread in dumps[0].threads for frame in thread.frames]
    assert any("<module>" in str(frame) for frame in frames), frames
    runtime.stop(["worker-0", "worker-1"])
    _pump(runtime, events, lambda: sum(isinstance(e, InstanceExited) for e in events) == 2, what="the stops")


LOCAL_K8S = Path(os.environ.get("TRAINWARDEN_LOCAL_K8S", ROOT / "deploy" / "k8s" / "local-k8s"))


@pytest.mark.skipif(os.environ.get("TRAINWARDEN_K8S_NODE_LOSS") != "1",
                    reason="kills a kubelet of the cluster for about 30 s: opt in with TRAINWARDEN_K8S_NODE_LOSS=1 "
                           "(and K8S_DIR) on a cluster no one else is using")
def test_a_node_whose_kubelet_dies_is_node_loss_and_the_next_round_runs_on_the_other_node(api, job):
    runtime, events, port = job
    _round(runtime, events, 0)
    lost = _pods(api, runtime)["worker-1"]["spec"]["nodeName"]
    subprocess.run([str(LOCAL_K8S), "kill-node", lost], check=True, capture_output=True, timeout=60)
    try:
        _pump(runtime, events, lambda: any(isinstance(e, NodeLost) for e in events), timeout=120,
              what=f"{lost}'s loss")
        loss = next(e for e in events if isinstance(e, NodeLost))
        assert loss.node == lost and "worker-1" in loss.instances
        runtime.stop([s.name for s in INSTANCES])
        _round(runtime, events, 1)
        assert lost not in {pod["spec"]["nodeName"] for pod in _pods(api, runtime).values()}
        assert runtime.recreated >= 1
    finally:
        subprocess.run([str(LOCAL_K8S), "restart-node", lost], check=True, capture_output=True, timeout=120)
