"""Where the agents runtime places a job's next incarnations: back on the
node each instance ran on, when that node can take it; elsewhere otherwise."""

from __future__ import annotations

from trainwarden.bus.messages import Heartbeat, StartInstance
from trainwarden.events import InstanceSpec, JobSpec, RoleSpec
from trainwarden.runtime.agents import AgentsRuntime
from trainwarden.runtime.base import AgentCommand, JobToRun
from trainwarden.runtime.nodes import Cluster
from trainwarden.settings import JobSettings

NOW = 100.0
NAMES = [f"worker-{i}" for i in range(4)]


def _runtime(nodes=("a", "b", "c", "d")) -> tuple[Cluster, AgentsRuntime]:
    cluster = Cluster(node_timeout_s=30)
    for node in nodes:
        cluster.heartbeat(Heartbeat(node=node, time=NOW, slots=1))
    job = JobToRun(job_id="j", spec=JobSpec(roles=(RoleSpec("worker", 4, ("sh", "-c", "true")),)),
                   instances=tuple(InstanceSpec(name, "worker", i, i) for i, name in enumerate(NAMES)),
                   settings=JobSettings())
    return cluster, AgentsRuntime(job, cluster, lambda: NOW + 1)


def _starts(runtime: AgentsRuntime) -> dict[str, str]:
    return {e.command.instance.name: e.command.node for e in runtime.drain()
            if isinstance(e, AgentCommand) and isinstance(e.command, StartInstance)}


def test_a_restarted_job_goes_back_to_the_nodes_its_instances_ran_on_whatever_the_order():
    cluster, runtime = _runtime()
    for name in NAMES:
        runtime.start(name, 0, 0)
    first = _starts(runtime)
    assert sorted(first.values()) == ["a", "b", "c", "d"]
    runtime.stop_all()
    for name in reversed(NAMES):  # the least used node first would put worker-3 where worker-0 was
        runtime.start(name, 1, 1)
    assert _starts(runtime) == first


def test_an_instance_whose_node_is_isolated_goes_elsewhere():
    cluster, runtime = _runtime(nodes=("a", "b", "c", "d", "spare"))
    for name in NAMES:
        runtime.start(name, 0, 0)
    first = _starts(runtime)
    runtime.stop_all()
    cluster.set_isolated(first["worker-2"], True, "c4d_error")
    for name in NAMES:
        runtime.start(name, 1, 1)
    second = _starts(runtime)
    assert second["worker-2"] == "spare"
    assert {n: second[n] for n in NAMES if n != "worker-2"} == {n: first[n] for n in NAMES if n != "worker-2"}
