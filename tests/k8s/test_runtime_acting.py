"""The kubernetes runtime's decisions against an apiserver in this process:
pods created once, restarts in place, only what must move recreated,
isolation, no pod left behind, nothing half-created. (The same against the
real local cluster: test_kube_cluster.py.)"""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("lightkube", reason="lightkube is not installed here (pip install -e '.[kubernetes]')")

import httpx2  # noqa: E402 - lightkube's HTTP client

from tests.history_seed import Clock  # noqa: E402
from tests.k8s.runtime_fixtures import MemoryApiserver, RecordingDriver, kube_runtime, run_round  # noqa: E402
from trainwarden.bus.messages import StartInstance  # noqa: E402
from trainwarden.events import InstanceExited, InstanceSpec, JobSpec, LogLine, NodeLost, RoleSpec  # noqa: E402
from trainwarden.runtime.kubernetes.drivers import AgentPodDriver  # noqa: E402
from trainwarden.runtime.kubernetes.runtime import KubeSite, uncordon  # noqa: E402
from trainwarden.runtime.kubernetes.section import KubernetesSection  # noqa: E402

INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))


def _runtime(server, namespace="default"):
    clock = Clock(100.0)
    driver = RecordingDriver()
    section = KubernetesSection(image="train:1", namespace=namespace)
    spec = JobSpec(roles=(RoleSpec("worker", 2, ("python", "train.py")),), runtime="kubernetes",
                   runtime_options=json.dumps({"kubernetes": section.to_wire()}))
    runtime, heard = kube_runtime(KubeSite(api=server.api(), driver=driver, watching=False), "job-1", spec, INSTANCES, clock)
    # What it says: the engine's events in the list; its errors, isolations and commands beside.
    return runtime, heard, driver, heard, clock


def _round(runtime, heard, clock, round_):
    run_round(runtime, heard, clock, round_, INSTANCES)


def test_a_round_creates_one_pod_per_instance_and_hands_each_its_incarnation():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    assert len(server.pods) == 2
    assert sorted((run[2], run[3]) for run in driver.runs) == [("worker-0", 0), ("worker-1", 0)]
    env = dict(driver.runs[0][5])
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["TRAINWARDEN_RESTART_ROUND"] == "0" and env["TRAINWARDEN_TOKEN"]


def _round_started(server):
    runtime, port, driver, events, clock = _runtime(server)
    _round(runtime, port, clock, 0)
    return runtime, port, driver, events, clock


def test_a_job_restart_runs_the_next_incarnation_in_the_same_pods():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    uids = {run[1] for run in driver.runs}
    runtime.stop([s.name for s in INSTANCES])
    _round(runtime, port, clock, 1)
    assert {run[1] for run in driver.runs if run[3] == 1} == uids
    assert server.deleted == [] and runtime.in_place == 2
    ports = {run[5]["MASTER_PORT"] for run in driver.runs}
    assert len(ports) == 2  # a port per round


def test_only_the_pod_on_an_isolated_node_is_recreated_elsewhere_and_uncordon_returns_the_node():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    on_n1 = [name for (_, name), pod in server.pods.items() if pod["spec"]["nodeName"] == "n1"]
    runtime.isolate_node("n1", "C4D: NCCL error on rank 0")
    node = server.nodes["n1"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [{"key": "trainwarden.io/isolated", "value": "true", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"]["trainwarden.io/isolated-reason"] == "C4D: NCCL error on rank 0"
    assert port.isolated == [("n1", True, "C4D: NCCL error on rank 0")]
    runtime.stop([s.name for s in INSTANCES])
    _round(runtime, port, clock, 1)
    assert server.deleted == on_n1
    assert {pod["spec"]["nodeName"] for pod in server.pods.values()} == {"n2"}
    assert uncordon(server.api(), "n1") is True
    assert server.nodes["n1"]["spec"] == {"unschedulable": False, "taints": []}
    assert "trainwarden.io/isolated-reason" not in server.nodes["n1"]["metadata"]["annotations"]


def test_a_node_that_goes_not_ready_is_node_loss_and_its_pod_moves():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    server.nodes["n1"]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    clock.advance(2.0)
    events.poll()
    assert [type(e) for e in events] == [NodeLost] and events[0].node == "n1"
    runtime.stop(list(events[0].instances))
    for name in events[0].instances:
        runtime.start(name, 1, 0)
    clock.advance(2.0)
    events.poll()
    assert {pod["spec"]["nodeName"] for pod in server.pods.values()} == {"n2"}


def test_a_job_that_ends_leaves_no_pod_behind():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    runtime.finish()
    assert server.pods == {}


def test_the_pods_of_a_job_that_ends_while_the_apiserver_is_down_are_deleted_once_it_answers():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    server.down = True
    runtime.finish()
    events.poll()
    [said] = events.errors
    assert said.startswith("the pods of job job-1 could not all be deleted (the apiserver kept failing"), said
    assert "they will be once the apiserver answers" in said
    assert len(server.pods) == 2 and runtime.site.waiting_sweep() == [("default", "job-1")]
    server.down = False
    assert _within(10.0, lambda: server.pods == {} and runtime.site.waiting_sweep() == []), server.pods_named()
    runtime.site.close()


def _within(seconds, condition):
    """Waits on the site's own thread (real time, at most ``seconds``)."""
    done = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        done.wait(0.05)
    return condition()


def test_an_unknown_namespace_fails_the_job_in_one_sentence_with_nothing_created():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _runtime(server, namespace="nope")
    _round(runtime, port, clock, 0)
    assert port.errors == ["the namespace 'nope' does not exist on the cluster (hint: create it (kubectl create "
                           "namespace nope) or fix 'kubernetes.namespace')"]
    assert server.pods == {} and driver.runs == []
    # The engine hears it as instances that could not start, with the sentence as their line.
    assert sorted((e.instance, e.exit_code) for e in events if isinstance(e, InstanceExited)) == [
        ("worker-0", 127), ("worker-1", 127)]
    assert {e.text for e in events if isinstance(e, LogLine)} == {
        "trainwarden: the job cannot run on Kubernetes: " + port.errors[0]}


def test_a_missing_permission_is_named_and_nothing_is_created():
    server = MemoryApiserver()
    server.forbid.add(("patch", "nodes"))
    runtime, port, driver, events, clock = _runtime(server)
    _round(runtime, port, clock, 0)
    assert port.errors[0].startswith("the actuator may not patch nodes (RBAC denies it)")
    assert server.pods == {}


def test_a_create_refused_after_the_first_pod_leaves_no_half_created_job():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _runtime(server)
    runtime.start("worker-0", 0, 0)
    assert len(server.pods) == 1
    server.forbid.add(("create", "pods"))  # RBAC changed between the two (a review allows what create refuses)
    runtime.start("worker-1", 0, 0)
    assert server.pods == {} and "may not create pods in namespace default" in port.errors[0]
    assert len(port.errors) == 1


def test_an_operators_isolate_and_uncordon_are_done_in_kubernetes_and_a_foreign_cordon_is_left_alone():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _runtime(server)
    site = runtime.site
    assert site.node_state("n1", True, "isolate by an operator") == []
    assert server.nodes["n1"]["spec"]["unschedulable"] is True
    assert server.nodes["n1"]["metadata"]["annotations"]["trainwarden.io/isolated-reason"] == "isolate by an operator"
    site.node_state("n1", False, "uncordon by an operator")
    assert server.nodes["n1"]["spec"] == {"unschedulable": False, "taints": []}
    server.nodes["n2"]["spec"]["unschedulable"] = True  # an administrator's own cordon, no taint of ours
    site.node_state("n2", False, "uncordon by an operator")
    assert server.nodes["n2"]["spec"]["unschedulable"] is True


def test_a_new_actuator_takes_the_jobs_pods_over_and_restarts_in_them():
    server = MemoryApiserver()
    first, port, driver, events, clock = _round_started(server)
    pods = server.pods_named()
    second, port2, driver2, events2, clock2 = _runtime(server)  # the same job, a new actuator
    _round(second, port2, clock2, 1)
    assert server.pods_named() == pods and server.deleted == []
    assert sorted(run[2] for run in driver2.runs) == ["worker-0", "worker-1"] and second.in_place == 2


def test_an_isolation_kubernetes_refuses_is_said_and_the_job_goes_on_off_that_node():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _round_started(server)
    real_handle = server.handle

    def refuse_patch(request):
        if request.method == "PATCH":
            return httpx2.Response(403, json={"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                              "code": 403, "message": 'nodes "n1" is forbidden'})
        return real_handle(request)

    server.handle = refuse_patch
    runtime.api = server.api()
    runtime.isolate_node("n1", "C4D")
    assert "may not patch node n1" in port.errors[0] and not runtime.failed
    runtime.stop([s.name for s in INSTANCES])
    _round(runtime, port, clock, 1)
    assert {pod["spec"]["nodeName"] for pod in server.pods.values()} == {"n2"}


def test_through_the_agents_each_run_is_a_start_for_the_pods_node_naming_the_pod():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _runtime(server)
    runtime.site.driver = AgentPodDriver()
    _round(runtime, port, clock, 0)
    starts = [c for c in port.commands if isinstance(c, StartInstance)]
    uids = {pod["metadata"]["uid"]: pod["spec"]["nodeName"] for pod in server.pods.values()}
    assert sorted(s.instance.name for s in starts) == ["worker-0", "worker-1"]
    for start in starts:
        env = dict(start.env)
        assert uids[env["TRAINWARDEN_POD_UID"]] == start.node  # the agent of the pod's node, for that pod
        assert (start.round, start.master_addr) == (0, "127.0.0.1") and "TRAINWARDEN_TOKEN" not in env


def test_a_rounds_instances_start_together_once_every_pod_of_it_runs():
    server = MemoryApiserver()
    runtime, port, driver, events, clock = _runtime(server)
    server.nodes["n1"]["spec"]["unschedulable"] = True
    server.nodes["n2"]["spec"]["unschedulable"] = True  # nothing can be scheduled yet: every pod Pending
    _round(runtime, port, clock, 0)
    assert len(server.pods) == 2 and driver.runs == []
    first = next(iter(server.pods.values()))
    first["spec"]["nodeName"], first["status"]["phase"] = "n1", "Running"  # one pod runs, the other does not
    for _ in range(3):
        clock.advance(1.0)
        events.poll()
    assert driver.runs == []  # no rank starts alone
    for pod in server.pods.values():
        pod["spec"]["nodeName"], pod["status"]["phase"] = "n1", "Running"
    for _ in range(3):
        clock.advance(1.0)
        events.poll()
    assert sorted((run[2], run[3]) for run in driver.runs) == [("worker-0", 0), ("worker-1", 0)]
