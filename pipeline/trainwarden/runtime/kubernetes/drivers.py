"""How an incarnation reaches the pod host of its pod (pod_host.py), which
lives on the pod's node: the runtime says what to run (``PodRun``), a
driver carries it there.

- ``AgentPodDriver``: through the node's agent, as every start on the
  cluster goes: a ``StartInstance`` for the pod's node, naming the pod
  (``TRAINWARDEN_POD_UID``). The agent builds the incarnation's environment
  and token as for its own instances and hands the run to the pod host
  (node_side.PodHosts) instead of starting a process itself; it adopts what
  the pod host starts, ships its lines and exit, dumps and stops it.
- ``LocalPodDriver``: the pod hosts reached from this machine, where the
  actuator runs beside the kubelets (CI, the tests, the bench): the same
  PodHosts the agent would use.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol

from trainwarden.bus.messages import StartInstance
from trainwarden.runtime.base import AgentCommand, RuntimeEvent
from trainwarden.runtime.kubernetes.node_side import POD_UID_VARIABLE, PodHosts


@dataclasses.dataclass(frozen=True)
class PodRun:
    """One incarnation for one pod's host: the start an agent takes (its
    environment: what the job asks for, and the pod's uid), and the whole
    incarnation environment for a driver that starts it itself."""

    start: StartInstance
    env: Mapping[str, str]

    @property
    def uid(self) -> str:
        return dict(self.start.env)[POD_UID_VARIABLE]


class PodDriver(Protocol):
    def ready(self, node: str, uid: str) -> bool:
        """The pod's host can take a run (it listens)."""

    def run(self, run: PodRun) -> list[RuntimeEvent]:
        """Hand the run to the pod's host; what the runtime has to say for it (the agent's command)."""

    def stop(self, node: str, uid: str, grace_s: float) -> None:
        """Stop what the pod's host runs (where no agent was told to, ``KubernetesRuntime.stop``)."""

    def poll(self) -> list:
        """Events of what the pod hosts run, where this driver follows them itself."""


class AgentPodDriver:
    """Through the node agents: each run is a command the runtime says (an ``AgentCommand``)."""

    def ready(self, node: str, uid: str) -> bool:
        return True  # the agent holds a run until the pod's host listens

    def run(self, run: PodRun) -> list[RuntimeEvent]:
        return [AgentCommand(run.start)]

    def stop(self, node: str, uid: str, grace_s: float) -> None:
        pass  # the agents were told (ClusterJob.stop_on_agents), with the stack dumps first when asked

    def poll(self) -> list:
        return []  # the agents send the events


class LocalPodDriver:
    def __init__(self, hosts: PodHosts):
        self.hosts = hosts

    def ready(self, node: str, uid: str) -> bool:
        return self.hosts.ready(uid)

    def run(self, run: PodRun) -> list[RuntimeEvent]:
        start = run.start
        self.hosts.run(run.uid, start.job_id, start.instance.name, start.round, start.start, list(start.command),
                       dict(run.env), start.workdir, node=start.node)
        return []  # its events come from ``poll``

    def stop(self, node: str, uid: str, grace_s: float) -> None:
        self.hosts.stop(uid, grace_s)

    def poll(self) -> list:
        return self.hosts.poll()
