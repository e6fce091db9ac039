"""A spot job on the kubernetes runtime, against an apiserver in this
process: released as a cloud's spot reclaim (SIGTERM in place through the
pod hosts, the pool's notice, then each pod marked DisruptionTarget and
deleted), resumed in new pods on its pool's nodes. (The same on the real
local cluster: tests/scenarios/test_spot_scenario.py.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lightkube", reason="lightkube is not installed here (pip install -e '.[kubernetes]')")

from tests.history_seed import Clock  # noqa: E402
from tests.k8s.runtime_fixtures import MemoryApiserver, RecordingDriver, kube_runtime, run_round  # noqa: E402
from trainwarden.bus.messages import StopInstances  # noqa: E402
from trainwarden.events import InstanceExited, InstanceSpec, JobSpec, Preempted, RoleSpec  # noqa: E402
from trainwarden.runtime.base import Capability  # noqa: E402
from trainwarden.runtime.kubernetes.check import check  # noqa: E402
from trainwarden.runtime.kubernetes.runtime import KubeSite  # noqa: E402
from trainwarden.runtime.kubernetes.section import KubernetesSection  # noqa: E402

INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))


def _spot_job(server, pools=(("worker", "general"),), section=None):
    clock = Clock(100.0)
    driver = RecordingDriver()
    section = section or KubernetesSection(image="train:1")
    spec = JobSpec(roles=(RoleSpec("worker", 2, ("python", "train.py")),), runtime="kubernetes",
                   runtime_options=json.dumps({"kubernetes": section.to_wire()}), spot_pools=pools)
    runtime, heard = kube_runtime(KubeSite(api=server.api(), driver=driver, watching=False), "spot-1", spec,
                                  INSTANCES, clock)
    return runtime, heard, driver, clock


def _round(runtime, heard, clock, round_):
    run_round(runtime, heard, clock, round_, INSTANCES)


def _turns(heard, clock, seconds):
    for _ in range(int(seconds / 0.5)):
        clock.advance(0.5)
        heard.poll()


def test_the_kubernetes_runtime_declares_it_can_release_a_spot_job():
    runtime, _, _, _ = _spot_job(MemoryApiserver())
    assert Capability.PREEMPT in runtime.capabilities


def test_a_release_stops_each_incarnation_in_place_and_only_after_the_notice_marks_its_pods_then_deletes_them():
    server = MemoryApiserver()
    runtime, heard, driver, clock = _spot_job(server)
    _round(runtime, heard, clock, 0)
    pods = server.pods_named()
    uids = {uid for _, uid, *_ in driver.runs}
    runtime.preempt(2.0)
    # SIGTERM first, in place: each pod's host is told (here the driver; on a cluster its agent, with the notice).
    assert {uid for _, uid in driver.stops} == uids
    [stop] = [c for c in heard.commands if isinstance(c, StopInstances)]
    assert stop.grace_s == 2.0 and sorted(stop.instances) == ["worker-0", "worker-1"]
    _turns(heard, clock, 1.5)
    assert server.calls == [] and server.pods_named() == pods  # the notice is not over
    _turns(heard, clock, 1.0)
    # Each pod marked DisruptionTarget before its deletion, as a cloud's spot reclaim does.
    assert sorted(server.calls) == sorted([("PATCH status", p) for p in pods] + [("DELETE", p) for p in pods])
    for pod in pods:
        assert server.calls.index(("PATCH status", pod)) < server.calls.index(("DELETE", pod))
    assert server.pods == {} and runtime.released == 2 and runtime.recreated == 0
    # Its own release is no news for the engine (the decision was the engine's): no Preempted, no exit.
    assert not [e for e in heard if isinstance(e, (Preempted, InstanceExited))], list(heard)


def test_the_release_condition_says_trainwarden_took_the_pod_for_the_spot_market():
    server = MemoryApiserver()
    runtime, heard, driver, clock = _spot_job(server)
    _round(runtime, heard, clock, 0)
    runtime.preempt(0.0)  # no notice: released at once
    assert len(server.gone) == 2
    for pod in server.gone.values():
        [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
        assert (condition["status"], condition["reason"]) == ("True", "TerminationByTrainwarden")
        assert "spot market took the capacity of job spot-1 back" in condition["message"]
        assert condition["lastTransitionTime"].endswith("Z")


def _released(notice_s, turns_s):
    """Round 0 ran, and the market took it back with this notice; ``turns_s`` of turns since."""
    server = MemoryApiserver()
    runtime, heard, driver, clock = _spot_job(server)
    _round(runtime, heard, clock, 0)
    first = server.pods_named()
    runtime.preempt(notice_s)
    _turns(heard, clock, turns_s)
    return server, runtime, heard, driver, clock, first


def test_the_resumed_round_runs_in_new_pods_on_the_pools_nodes():
    server, runtime, heard, driver, clock, first = _released(1.0, 2.0)
    _round(runtime, heard, clock, 1)
    assert server.pods_named() == sorted(name[:-1] + "1" for name in first)  # the next generation of each
    assert sorted((run[2], run[3]) for run in driver.runs if run[3] == 1) == [("worker-0", 1), ("worker-1", 1)]
    for pod in server.pods.values():
        spec = pod["spec"]
        assert spec["nodeSelector"] == {"trainwarden.io/pool": "general"}
        assert spec["tolerations"] == [{"key": "trainwarden.io/pool", "operator": "Equal", "value": "general"}]


def test_a_round_resumed_before_the_notice_is_over_releases_the_old_pods_first():
    server, runtime, heard, driver, clock, first = _released(30.0, 0.0)
    _round(runtime, heard, clock, 1)
    assert [call for call in server.calls if call[1] in first] == [
        ("PATCH status", first[0]), ("DELETE", first[0]), ("PATCH status", first[1]), ("DELETE", first[1])]
    assert len(server.pods) == 2 and not set(server.pods_named()) & set(first)
    _turns(heard, clock, 31.0)
    assert runtime.released == 2  # released once each, not again when the notice ends


def test_the_pool_label_and_taint_are_the_job_files_to_choose_and_a_role_on_ordinary_capacity_has_neither():
    server = MemoryApiserver()
    section = KubernetesSection(image="train:1", node_selector=(("zone", "a"),),
                                pool_label="cloud.google.com/gke-spot", pool_taint="")
    runtime, heard, driver, clock = _spot_job(server, section=section)
    _round(runtime, heard, clock, 0)
    for pod in server.pods.values():
        assert pod["spec"]["nodeSelector"] == {"zone": "a", "cloud.google.com/gke-spot": "general"}
        assert "tolerations" not in pod["spec"]
    server = MemoryApiserver()
    runtime, heard, driver, clock = _spot_job(server, pools=())
    _round(runtime, heard, clock, 0)
    assert all("nodeSelector" not in pod["spec"] for pod in server.pods.values())


def test_a_spot_job_needs_the_right_to_mark_its_pods_and_is_refused_in_one_sentence_without_it():
    server = MemoryApiserver()
    server.forbid.add(("patch", "pods"))
    runtime, heard, driver, clock = _spot_job(server)
    _round(runtime, heard, clock, 0)
    assert heard.errors == ["the actuator may not patch pods/status in namespace default (RBAC denies it) (hint: "
                            "apply deploy/k8s (the actuator's Role and ClusterRole) or grant that verb)"]
    assert server.pods == {}
    ordinary, heard, driver, clock = _spot_job(server, pools=())
    _round(ordinary, heard, clock, 0)
    assert heard.errors == [] and len(server.pods) == 2  # a job on ordinary capacity does not need it


def test_submits_check_asks_a_job_file_with_a_spot_role_for_the_right_to_mark_its_pods(tmp_path):
    server = MemoryApiserver()
    server.forbid.add(("patch", "pods"))
    job = tmp_path / "job.yaml"
    role = "worker: {count: 2, command: [python, train.py]%s}"
    job.write_text("roles:\n  " + role % "" + "\nkubernetes: {image: 'train:1'}\n")
    assert check(str(job), api=server.api()) == ""
    job.write_text("roles:\n  " + role % ", spot: {SpotStrategy: SpotWithPriceLimit, SpotDiscountLimit: 0.5, "
                   "instance_type: ecs.g7.xlarge}" + "\nkubernetes: {image: 'train:1'}\n")
    assert check(str(job), api=server.api()).startswith("the actuator may not patch pods/status in namespace default")
