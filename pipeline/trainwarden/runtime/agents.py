"""The ``agents`` runtime: one job's instances on Trainwarden's node agents.

The actuator places each incarnation on a ready node with a free slot and
sends start/stop commands, keyed by node, to the agents; a hang's stop asks
each node's agent to dump the stacks first. Everything it needs from the
actuator service comes through ``ClusterPort``.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Protocol, Sequence

from trainwarden.bus.messages import StartInstance, StopInstances
from trainwarden.events import InstanceSpec, JobSpec
from trainwarden.runtime.base import Capability
from trainwarden.runtime.environment import job_env
from trainwarden.runtime.nodes import Cluster, NoCapacity, master_port
from trainwarden.settings import JobSettings


class ClusterPort(Protocol):
    """What a cluster runtime may ask of the actuator service."""

    cluster: Cluster
    clock: Callable[[], float]

    def send_command(self, command) -> None: ...
    def expect_dumps(self, report_id: str, job_id: str, node: str) -> None: ...
    def isolate(self, node: str, isolated: bool, reason: str) -> None: ...
    def no_capacity(self) -> None: ...
    def node_lost(self, job_id: str, node: str, instances: Sequence[str]) -> None: ...
    def preempted(self, job_id: str, round_: int, reason: str) -> None: ...
    def slurm_error(self, job_id: str, text: str) -> None: ...


class ClusterJob:
    """What every cluster runtime shares: the job, its incarnations, and
    stopping through the agents of the nodes its instances are placed on
    (each dumps the stacks first when asked)."""

    def __init__(self, port: ClusterPort, job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec],
                 settings: JobSettings):
        self.port = port
        self.job_id = job_id
        self.spec = spec
        self.specs = {i.name: i for i in instances}
        self.settings = settings
        self.instance_names = list(self.specs)
        self.incarnation: dict[str, tuple[int, int]] = {}
        self.nodes_used: set[str] = set()  # every node an instance of the job ran on: told when it ends

    def stop_on_agents(self, names: Sequence[str], snapshot: str,
                       incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        """Stop these instances where they run: ``incarnations`` (the
        decision's) exactly, else the ones this actuator started last."""
        known = {**self.incarnation, **(incarnations or {})}
        by_node = self.port.cluster.release(self.job_id, list(names))
        # An incarnation this actuator did not place (a new actuator finishing
        # what its predecessor began) is stopped where the agents say it runs.
        for name in names:
            if name in known:
                for node in self.running_at(name, *known[name]):
                    if name not in by_node.setdefault(node, []):
                        by_node[node].append(name)
        for node, instances in by_node.items():
            if not instances:
                continue
            targets = tuple((name, *known[name]) for name in instances if name in known)
            if snapshot:
                self.port.expect_dumps(snapshot, self.job_id, node)
            self.port.send_command(StopInstances(node=node, job_id=self.job_id, action_id="stop",
                                                 instances=tuple(instances), grace_s=self.spec.stop_grace_s,
                                                 incarnations=targets, snapshot_report=snapshot))

    def end_on_agents(self) -> None:
        """The job is over: each agent it ran on stops what is left of it
        and lets go of its standbys and keeper."""
        for node in sorted(self.nodes_used):
            self.port.send_command(StopInstances(node=node, job_id=self.job_id, action_id="end", instances=(),
                                                 grace_s=self.spec.stop_grace_s, job_ended=True))

    def stop_all(self, snapshot: str = "") -> None:
        self.stop(self.instance_names, snapshot)  # each runtime's own stop

    def restore(self, incarnations: Mapping[str, tuple[int, int]]) -> None:
        """A new actuator: each instance's newest incarnation as its own
        durable records say (started, or about to be). Any other incarnation
        a heartbeat reports is one to stop, however new it looks."""
        for name, incarnation in incarnations.items():
            if name in self.specs and tuple(incarnation) > self.incarnation.get(name, (-1, -1)):
                self.incarnation[name] = tuple(incarnation)

    def running_at(self, instance: str, round_: int, start: int) -> list[str]:
        """The nodes whose last heartbeat reports this incarnation (running, or held to start there)."""
        return sorted(node.name for node in self.port.cluster.nodes.values()
                      if any((r.job_id, r.instance, r.round, r.start) == (self.job_id, instance, round_, start)
                             for r in node.running))

    def heard(self, instance: str, round_: int, start: int, node: str) -> bool:
        """A node's heartbeat says this incarnation runs there: True when that
        is where it should run (it is running), False when it must be stopped."""
        placement = self.port.cluster.placement.setdefault(self.job_id, {})
        if instance not in self.incarnation:
            # Records written before they named incarnations: learned from the agents.
            self.incarnation[instance] = (round_, start)
        self.nodes_used.add(node)
        if self.incarnation[instance] != (round_, start):
            return False
        if self.places_itself or instance not in placement:
            # The scheduler placed it, or a new actuator learns where its
            # current incarnation runs: where it runs is where it is.
            placement[instance] = node
        return placement.get(instance) == node

    places_itself = False  # True where a scheduler, not the actuator, picks the nodes


class AgentsRuntime(ClusterJob):
    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE,
                              Capability.STACK_DUMP})

    def __init__(self, port: ClusterPort, job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec],
                 settings: JobSettings):
        super().__init__(port, job_id, spec, instances, settings)
        self.waiting: list[tuple[str, int, int]] = []  # starts waiting for a free slot

    def start(self, name: str, round_: int, start: int) -> None:
        # The same incarnation again (an action finished after a crash or a
        # bus error) goes where it was sent, whose agent ignores it.
        again = self.incarnation.get(name) == (round_, start)
        self.incarnation[name] = (round_, start)
        try:
            self._send_start(name, round_, start, again)
        except NoCapacity:
            self.port.no_capacity()
            self.waiting.append((name, round_, start))

    def retry_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for name, round_, start in waiting:
            if self.incarnation.get(name) == (round_, start):
                self.start(name, round_, start)

    def _send_start(self, name: str, round_: int, start: int, again: bool = False) -> None:
        cluster = self.port.cluster
        placed = cluster.placement.get(self.job_id, {}).get(name) if again else None
        prefer = placed or next(iter(self.running_at(name, round_, start)), None)
        node = cluster.place(self.job_id, name, self.port.clock(), prefer=prefer)
        self.nodes_used.add(node.name)
        rank0 = min(self.specs.values(), key=lambda s: s.rank).name
        master_node = cluster.placement.get(self.job_id, {}).get(rank0, node.name)
        role = self.spec.role(self.specs[name].role)
        self.port.send_command(StartInstance(
            node=node.name, job_id=self.job_id, action_id=f"{self.job_id}/{name}/{round_}/{start}",
            instance=self.specs[name], round=round_, start=start, world_size=len(self.specs),
            master_addr=cluster.nodes[master_node].address if master_node in cluster.nodes else node.address,
            master_port=master_port(self.job_id, round_), command=role.command,
            env=tuple(sorted(job_env(self.spec, role, self.settings).items())),
            workdir=self.spec.workdir, max_restarts=self.settings.max_num_of_job_restart, preload=self.spec.preload))

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        self.waiting = [w for w in self.waiting if w[0] not in names]
        self.stop_on_agents(names, snapshot, incarnations)

    def isolate_node(self, node: str, reason: str) -> None:
        self.port.isolate(node, True, reason)

    def finish(self) -> None:
        self.waiting = []
        self.end_on_agents()


class UnplacedRuntime:
    """A job this actuator never started (its decisions arrive, its placement
    does not): nothing to stop or start, but a node can still be isolated."""

    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE})
    instance_names: list = []

    def __init__(self, port: ClusterPort):
        self.port = port

    def start(self, name: str, round_: int, start: int) -> None:
        pass

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        pass

    def end_on_agents(self) -> None:
        """The job is over: each agent it ran on stops what is left of it
        and lets go of its standbys and keeper."""
        for node in sorted(self.nodes_used):
            self.port.send_command(StopInstances(node=node, job_id=self.job_id, action_id="end", instances=(),
                                                 grace_s=self.spec.stop_grace_s, job_ended=True))

    def stop_all(self, snapshot: str = "") -> None:
        pass

    def isolate_node(self, node: str, reason: str) -> None:
        self.port.isolate(node, True, reason)
