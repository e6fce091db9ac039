"""A runtime written here, in the tests: processes on this machine under
another name. ``pinned`` runs each instance on the node agent its rank picks
among the ready nodes (sorted by name), as a scheduler would place them,
never by the actuator's least-used placement; it isolates a node by leaving
it out of what it picks from. It plugs in by its registry entry alone
(``KIND``, registered while its scenarios run: tests/scenarios/test_scenarios.py):
no line of the actuator, the CLI or the scenario driver names it. The proof
that the next engine is one package and one entry.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from trainwarden.runtime.agents import ClusterJob
from trainwarden.runtime.base import Capability, JobToRun, NodeIsolated, RuntimeEvent
from trainwarden.runtime.nodes import Cluster, NodeStatus
from trainwarden.runtime.kind import RuntimeKind


class PinnedRuntime(ClusterJob):
    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE,
                              Capability.STACK_DUMP})
    places_itself = True

    def _node_for(self, name: str) -> Optional[str]:
        ready = sorted(n.name for n in self.cluster.nodes.values() if n.status is NodeStatus.READY and n.last_seen)
        return ready[self.specs[name].rank % len(ready)] if ready else None

    def start(self, name: str, round_: int, start: int) -> None:
        self.incarnation[name] = (round_, start)
        node = self._node_for(name)
        if node is None:
            self.wait_for_capacity(name, round_, start)  # tried again each turn (ClusterJob.poll)
            return
        self.cluster.placement.setdefault(self.job_id, {})[name] = node
        self.send_start(name, round_, start, node)

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        self.stop_on_agents(names, snapshot, incarnations)

    def isolate_node(self, node: str, reason: str) -> None:
        self.say(NodeIsolated(node, reason))  # the actuator marks it isolated: never picked again

    def finish(self) -> None:
        self.end_on_agents()


class PinnedSite:
    built: list[str] = []  # the jobs it built a runtime for: the scenarios check theirs ran here

    def runtime(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float]) -> PinnedRuntime:
        self.built.append(job.job_id)
        return PinnedRuntime(job, cluster, clock)

    def node_state(self, node: str, isolated: bool, reason: str) -> list[RuntimeEvent]:
        return []

    def describe(self) -> str:
        return ""


def _site(options: Mapping[str, Any], run_as: Any) -> PinnedSite:
    return PinnedSite()


KIND = RuntimeKind("pinned", "the node agents, each instance on the node its rank picks (the tests' own runtime)",
                   "trainwarden submit --runtime pinned", "tests.scenarios.pinned:PinnedRuntime", site=_site)
