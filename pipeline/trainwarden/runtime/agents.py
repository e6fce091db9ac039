"""The ``agents`` runtime: one job's instances on Trainwarden's node agents.

The actuator places each incarnation on a ready node with a free slot and
sends start/stop commands, keyed by node, to the agents; a hang's stop asks
each node's agent to dump the stacks first. It reads and places into the
actuator's node table (``Cluster``) and says everything else as typed
events (runtime/base.py), which the actuator carries out.
"""

from __future__ import annotations

import collections
from typing import Callable, Mapping, Optional, Sequence

from trainwarden.bus.messages import StartInstance, StopInstances
from trainwarden.runtime.base import (AgentCommand, Capability, DumpsExpected, JobToRun, NodeIsolated, RuntimeEvent,
                                      WaitingForCapacity)
from trainwarden.runtime.environment import job_env
from trainwarden.runtime.nodes import Cluster, NoCapacity, master_port


class Outbox:
    """What a runtime has to say, kept in order until the service asks (``drain``)."""

    def __init__(self) -> None:
        self._said: list[RuntimeEvent] = []

    def say(self, event: RuntimeEvent) -> None:
        self._said.append(event)

    def send(self, command) -> None:
        self._said.append(AgentCommand(command))

    def drain(self) -> list[RuntimeEvent]:
        said, self._said = self._said, []
        return said

    def poll(self) -> list[RuntimeEvent]:
        return self.drain()


class ClusterJob(Outbox):
    """What every cluster runtime shares: the job, its incarnations, and
    stopping through the agents of the nodes its instances are placed on
    (each dumps the stacks first when asked)."""

    def __init__(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float]):
        super().__init__()
        self.cluster = cluster
        self.clock = clock
        self.job_id = job.job_id
        self.spec = job.spec
        self.specs = {i.name: i for i in job.instances}
        self.settings = job.settings
        self.instance_names = list(self.specs)
        self.rank0 = min(self.specs.values(), key=lambda s: s.rank).name if self.specs else ""
        self.incarnation: dict[str, tuple[int, int]] = {}
        self.nodes_used: set[str] = set()  # every node an instance of the job ran on: told when it ends
        # Where each instance was last sent: its next incarnation goes back
        # there if that node can take it (its files, caches and directories
        # are there; a 1,024-wide restart otherwise moved nearly every instance).
        self.last_node: dict[str, str] = {}
        # Instances stopped and not placed again yet, by the node they left,
        # and how many per node: an instance that cannot go back to its own
        # leaves the others' slots to them.
        self.returning: dict[str, str] = {}
        self.held: collections.Counter = collections.Counter()
        self.waiting: list[tuple[str, int, int]] = []  # starts waiting for a free slot

    def wait_for_capacity(self, name: str, round_: int, start: int) -> None:
        self.say(WaitingForCapacity(name))
        self.waiting.append((name, round_, start))

    def poll(self) -> list[RuntimeEvent]:
        """Each turn: the starts that waited for a free slot, tried again."""
        waiting, self.waiting = self.waiting, []
        for name, round_, start in waiting:
            if self.incarnation.get(name) == (round_, start):
                self.start(name, round_, start)
        return self.drain()

    def stop_on_agents(self, names: Sequence[str], snapshot: str,
                       incarnations: Optional[Mapping[str, tuple[int, int]]] = None,
                       grace_s: Optional[float] = None) -> None:
        """Stop these instances where they run: ``incarnations`` (the
        decision's) exactly, else the ones this actuator started last."""
        self.waiting = [w for w in self.waiting if w[0] not in names]
        known = {**self.incarnation, **(incarnations or {})}
        by_node = self.cluster.release(self.job_id, list(names))
        for node, released in by_node.items():
            for name in released:
                if name not in self.returning:
                    self.returning[name] = node
                    self.held[node] += 1
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
                self.say(DumpsExpected(snapshot, node))
            self.send(StopInstances(node=node, job_id=self.job_id, action_id="stop",
                                                 instances=tuple(instances),
                                                 grace_s=self.spec.stop_grace_s if grace_s is None else grace_s,
                                                 incarnations=targets, snapshot_report=snapshot))

    def end_on_agents(self) -> None:
        """The job is over: each agent it ran on stops what is left of it
        and lets go of its standbys and keeper."""
        self.waiting = []
        for node in sorted(self.nodes_used):
            self.send(StopInstances(node=node, job_id=self.job_id, action_id="end", instances=(),
                                                 grace_s=self.spec.stop_grace_s, job_ended=True))

    def send_start(self, name: str, round_: int, start: int, node: str) -> None:
        """Start this incarnation on the agent of ``node`` (placed there
        already): rank 0's node is the master."""
        cluster = self.cluster
        self.nodes_used.add(node)
        self.last_node[name] = node
        master_node = cluster.placement.get(self.job_id, {}).get(self.rank0, node)
        where = cluster.nodes[master_node] if master_node in cluster.nodes else cluster.nodes[node]
        role = self.spec.role(self.specs[name].role)
        self.send(StartInstance(
            node=node, job_id=self.job_id, action_id=f"{self.job_id}/{name}/{round_}/{start}",
            instance=self.specs[name], round=round_, start=start, world_size=len(self.specs),
            master_addr=where.address, master_port=master_port(self.job_id, round_), command=role.command,
            env=tuple(sorted(job_env(self.spec, role, self.settings).items())),
            workdir=self.spec.workdir, max_restarts=self.settings.max_num_of_job_restart, preload=self.spec.preload))

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
        return self.cluster.running_at(self.job_id, instance, round_, start)

    def heard(self, instance: str, round_: int, start: int, node: str) -> bool:
        """A node's heartbeat says this incarnation runs there: True when that
        is where it should run (it is running), False when it must be stopped."""
        placement = self.cluster.placement.setdefault(self.job_id, {})
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
                              Capability.STACK_DUMP, Capability.PREEMPT})

    def start(self, name: str, round_: int, start: int) -> None:
        # The same incarnation again (an action finished after a crash or a
        # bus error) goes where it was sent, whose agent ignores it.
        again = self.incarnation.get(name) == (round_, start)
        self.incarnation[name] = (round_, start)
        try:
            self._send_start(name, round_, start, again)
        except NoCapacity:
            self.wait_for_capacity(name, round_, start)

    def _send_start(self, name: str, round_: int, start: int, again: bool = False) -> None:
        cluster = self.cluster
        placed = cluster.placement.get(self.job_id, {}).get(name) if again else None
        prefer = placed or next(iter(self.running_at(name, round_, start)), None) or self.last_node.get(name)
        left = self.returning.get(name)
        node = cluster.place(self.job_id, name, self.clock(), prefer=prefer,
                             held=lambda node: self.held[node] - (node == left))
        if self.returning.pop(name, None) is not None:
            self.held[left] -= 1
        self.send_start(name, round_, start, node.name)

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        self.stop_on_agents(names, snapshot, incarnations)

    def isolate_node(self, node: str, reason: str) -> None:
        self.say(NodeIsolated(node, reason))

    def preempt(self, notice_s: float) -> None:
        """The market took a spot job's capacity back: SIGTERM, and the pool's
        notice before SIGKILL (none: at once), as a cloud's reclaim gives."""
        self.stop_on_agents(self.instance_names, "", dict(self.incarnation), grace_s=notice_s)

    def finish(self) -> None:
        self.end_on_agents()


class UnplacedRuntime(Outbox):
    """A job this actuator never started (its decisions arrive, its placement
    does not): nothing to stop or start, but a node can still be isolated."""

    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE})
    instance_names: list = []

    def start(self, name: str, round_: int, start: int) -> None:
        pass

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        pass

    def stop_all(self, snapshot: str = "") -> None:
        pass

    def restore(self, incarnations: Mapping[str, tuple[int, int]]) -> None:
        pass

    def heard(self, instance: str, round_: int, start: int, node: str) -> bool:
        return False

    def isolate_node(self, node: str, reason: str) -> None:
        self.say(NodeIsolated(node, reason))

    def finish(self) -> None:
        pass


class AgentsSite:
    """The node agents are always there: every actuator reaches them."""

    def runtime(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float]) -> AgentsRuntime:
        return AgentsRuntime(job, cluster, clock)

    def node_state(self, node: str, isolated: bool, reason: str) -> list[RuntimeEvent]:
        return []  # the actuator's own table is the agents' isolation

    def describe(self) -> str:
        return ""
