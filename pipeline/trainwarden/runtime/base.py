"""What a runtime is: the place one job's instances run (processes on this
machine, Trainwarden's node agents, a scheduler's cluster), as the acting
half drives it (supervision/acting.Supervisor, services/actuator_service.py).

A runtime declares what it can do; the actuator asks the declaration, never
the object (no ``hasattr``), and records a decision it cannot carry out as
``unsupported``. A runtime has the methods of the capabilities it declares,
and only those: ``isolate_node`` with ``ISOLATE_NODE`` (``NodeIsolation``),
``preempt`` with ``PREEMPT`` (``Preemption``).

A runtime never calls into the service that drives it. What it sees (a node
lost, the capacity taken back, its engine's own error) and what it has to
send (commands for the node agents, stack dumps to expect, a node isolated)
are typed events (``RuntimeEvent``) it hands back from ``poll`` and
``drain``, in the order it said them; the service carries them out.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Protocol, Sequence, Union

from trainwarden.events import InstanceSpec, JobSpec
from trainwarden.settings import JobSettings

if TYPE_CHECKING:
    from trainwarden.runtime.nodes import Cluster


class Capability(str, enum.Enum):
    RESTART_JOB = "restart_job"  # stop every instance and start the next round
    RESTART_INSTANCE = "restart_instance"  # one instance, the others keep running
    ISOLATE_NODE = "isolate_node"  # keep new instances off a node (cordon, drain)
    STACK_DUMP = "stack_dump"  # dump a hung job's stacks before stopping it
    PREEMPT = "preempt"  # the market took the capacity back (spot jobs)


# ------------------------------------------------------------------ events

@dataclasses.dataclass(frozen=True)
class NodeDown:
    """The runtime's engine says a node holding these instances is gone:
    node loss, which the job's engine decides about."""

    node: str
    instances: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CapacityTaken:
    """The scheduler took the round's capacity back while its nodes were up
    (a preemption, not a fault)."""

    round: int
    reason: str


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """Another event for the job's engine that the runtime's engine saw
    (events.py: an instance's exit no agent reports, say), sent as it is."""

    event: object


@dataclasses.dataclass(frozen=True)
class EngineError:
    """The runtime's engine failed a call (its controller restarting, a
    command timing out): said, counted, and tried again next turn."""

    text: str


@dataclasses.dataclass(frozen=True)
class WaitingForCapacity:
    """An incarnation found no free slot: it waits, and is tried again each turn."""

    instance: str


@dataclasses.dataclass(frozen=True)
class AgentCommand:
    """A command for the node agents (bus/messages.py: StartInstance,
    StopInstances, ExpectTasks), sent keyed by its node."""

    command: object


@dataclasses.dataclass(frozen=True)
class DumpsExpected:
    """A hang's stop on this node: its agent's stack dumps belong to this report."""

    report_id: str
    node: str


@dataclasses.dataclass(frozen=True)
class NodeIsolated:
    """The runtime isolated a node (the decision's): the cluster keeps new instances off it."""

    node: str
    reason: str


RuntimeEvent = Union[NodeDown, CapacityTaken, JobEvent, EngineError, WaitingForCapacity, AgentCommand,
                     DumpsExpected, NodeIsolated]


# ---------------------------------------------------------------- runtimes

class JobRuntime(Protocol):
    """One job's instances, wherever they run: every call the acting half makes."""

    capabilities: frozenset[Capability]
    instance_names: list[str]

    def start(self, name: str, round_: int, start: int) -> None:
        """Start this incarnation of an instance (asynchronously where it runs remotely)."""

    def stop(self, names: Sequence[str], snapshot: str = "",
             incarnations: Optional[Mapping[str, tuple[int, int]]] = None) -> None:
        """Stop these instances; with ``snapshot`` (a report id), dump their
        stacks first and hand the dumps to the job's stack reports. With
        ``incarnations`` (name -> (round, start), the decision's), only those:
        never a newer incarnation that took the name meanwhile."""

    def stop_all(self, snapshot: str = "") -> None: ...

    def restore(self, incarnations: Mapping[str, tuple[int, int]]) -> None:
        """A new actuator: each instance's newest incarnation, as its durable
        records say; any other one a node reports is to be stopped."""

    def heard(self, instance: str, round_: int, start: int, node: str) -> bool:
        """A node says this incarnation runs there: True where it should run
        (it is running), False when it must be stopped."""

    def poll(self) -> list[RuntimeEvent]:
        """One turn of the service's loop: look at the engine, retry what
        waits; returns what it has to say since last asked (``drain``)."""

    def drain(self) -> list[RuntimeEvent]:
        """What it has said since last asked (its starts' and stops'
        commands too), in order, once."""

    def finish(self) -> None:
        """The job is over: let go of everything it holds (its allocation, the agents' standbys)."""


class NodeIsolation(Protocol):
    """A runtime declaring ``Capability.ISOLATE_NODE``."""

    def isolate_node(self, node: str, reason: str) -> None: ...


class Preemption(Protocol):
    """A runtime declaring ``Capability.PREEMPT``."""

    def preempt(self, notice_s: float) -> None: ...


@dataclasses.dataclass(frozen=True)
class JobToRun:
    """What the actuator knows of a job it starts: a runtime is built for it."""

    job_id: str
    spec: JobSpec
    instances: tuple[InstanceSpec, ...]
    settings: JobSettings


class RuntimeSite(Protocol):
    """Where an actuator reaches one kind of runtime, configured once from
    its options (runtime/registry.py): builds each job's runtime."""

    def runtime(self, job: JobToRun, cluster: "Cluster", clock: Callable[[], float]) -> JobRuntime:
        """The job's runtime; ``cluster`` is the actuator's table of the nodes
        (heartbeats, placement), read and placed into, never replaced."""

    def node_state(self, node: str, isolated: bool, reason: str) -> list[RuntimeEvent]:
        """A node isolated or uncordoned (a rule's or an operator's): done in
        the runtime's engine too where it has its own (drained, resumed)."""

    def describe(self) -> str:
        """For the actuator's start line, e.g. where its jobs' files go; "" for nothing to say."""
