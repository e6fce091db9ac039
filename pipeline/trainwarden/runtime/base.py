"""What a runtime is: the place one job's instances run (processes on this
machine, Trainwarden's node agents, Slurm), as the actuator drives it.

A runtime declares what it can do; the actuator asks the declaration, never
the object (no ``hasattr``), and records a decision it cannot carry out as
``unsupported``. A runtime has the methods of the capabilities it declares,
and only those: ``isolate_node`` with ``ISOLATE_NODE`` (``NodeIsolation``),
``preempt`` with ``PREEMPT`` (``Preemption``).
"""

from __future__ import annotations

import enum
from typing import Mapping, Optional, Protocol, Sequence


class Capability(str, enum.Enum):
    RESTART_JOB = "restart_job"  # stop every instance and start the next round
    RESTART_INSTANCE = "restart_instance"  # one instance, the others keep running
    ISOLATE_NODE = "isolate_node"  # keep new instances off a node (cordon, drain)
    STACK_DUMP = "stack_dump"  # dump a hung job's stacks before stopping it
    PREEMPT = "preempt"  # the market took the capacity back (spot jobs)


class JobRuntime(Protocol):
    """One job's instances, wherever they run."""

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


class NodeIsolation(Protocol):
    """A runtime declaring ``Capability.ISOLATE_NODE``."""

    def isolate_node(self, node: str, reason: str) -> None: ...


class Preemption(Protocol):
    """A runtime declaring ``Capability.PREEMPT``."""

    def preempt(self, notice_s: float) -> None: ...
