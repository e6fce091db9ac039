"""A cluster that exists only on a virtual clock.

It plays the runtime's part for rule unit tests and simulations: instances
start the moment they are asked to, decisions take effect at once, and time
advances only when the caller says so. Everything goes through ``engine.step``
exactly as in a real run.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

from trainwarden.engine.core import start_job, step
from trainwarden.events import (
    Decision,
    DecisionKind,
    Diagnosis,
    NodeLost,
    Event,
    InstanceExited,
    InstanceSpec,
    InstanceStarted,
    JobSubmitted,
    LogLine,
    MarketUpdate,
    Offer,
    Preempted,
    SdkMessage,
    SdkOp,
    SpotBid,
    Tick,
)
from trainwarden.rules.model import RulePack


@dataclasses.dataclass
class TimedDecision:
    at: float
    decision: Decision


def instance_specs(roles: Iterable[tuple[str, int]]) -> tuple[InstanceSpec, ...]:
    """Instances named ``role-index``, ranked in the order the roles are given."""
    specs = []
    for role, count in roles:
        for index in range(count):
            specs.append(InstanceSpec(name=f"{role}-{index}", role=role, index=index, rank=len(specs)))
    return tuple(specs)


class VirtualCluster:
    def __init__(self, pack: RulePack, job_id: str, args: str, instances: tuple[InstanceSpec, ...],
                 framework: str = "pytorch", node: str = "virtual-node", start_at: float = 0.0,
                 spot: tuple[SpotBid, ...] = ()):
        self.node = node
        self.now = start_at
        self.decisions: list[TimedDecision] = []
        # (round, start) of each instance's previous incarnation, to play stale events.
        self.previous: dict[str, tuple[int, int]] = {}
        self.current: dict[str, tuple[int, int]] = {}
        # How many times each instance's node was isolated: it then runs on a fresh one.
        self.moves: dict[str, int] = {}
        submitted = JobSubmitted(job_id=job_id, time=start_at, framework=framework, args=args, instances=instances,
                                 spot=spot)
        self.state, first = start_job(submitted, pack, start_at)
        self._record(first)
        self._execute(first)

    @property
    def job_id(self) -> str:
        return self.state.job_id

    def feed(self, event: Event) -> list[Decision]:
        self.state, decisions = step(self.state, event, self.now)
        self._record(decisions)
        self._execute(decisions)
        return decisions

    def advance(self, to: float) -> None:
        self.now = max(self.now, to)

    def tick(self) -> list[Decision]:
        return self.feed(Tick(job_id=self.job_id, time=self.now))

    # ---------------------------------------------------------- builders

    def _where(self, name: str, stale: bool = False) -> tuple[int, int]:
        """The incarnation an event comes from: the running one, or (stale) the one before it."""
        if stale:
            return self.previous.get(name, (-1, -1))
        inst = self.state.instances[name]
        return self.state.round, inst.start

    def log(self, name: str, text: str, stale: bool = False) -> list[Decision]:
        round_, start = self._where(name, stale)
        return self.feed(LogLine(job_id=self.job_id, time=self.now, instance=name, round=round_, start=start, text=text))

    def exit(self, name: str, code: int, tail: Iterable[str] = (), stale: bool = False) -> list[Decision]:
        for line in tail:
            self.log(name, line, stale)
        round_, start = self._where(name, stale)
        return self.feed(InstanceExited(job_id=self.job_id, time=self.now, instance=name, round=round_,
                                        start=start, exit_code=code))

    def sdk(self, name: str, op: SdkOp, *, content: str = "", keywords: tuple[str, ...] = (),
            interval: Optional[int] = None, step: Optional[int] = None) -> list[Decision]:
        round_, start = self._where(name)
        return self.feed(SdkMessage(job_id=self.job_id, time=self.now, instance=name, round=round_, start=start,
                                    op=op, content=content, keywords=keywords, interval=interval, step=step))

    def node_lost(self, name: str) -> list[Decision]:
        """The node of this instance is lost; every instance there is named.
        Instances are spread one per virtual node, named after the instance."""
        return self.feed(NodeLost(job_id=self.job_id, time=self.now, node=self._node_of(name), instances=(name,)))

    def c4d(self, name: str, kind: str, level: str) -> list[Decision]:
        return self.feed(Diagnosis(job_id=self.job_id, time=self.now, node=self._node_of(name), source="c4d",
                                   kind=kind, level=level, rank=self.state.instances[name].spec.rank))

    def market(self, offers: tuple[Offer, ...]) -> list[Decision]:
        return self.feed(MarketUpdate(job_id=self.job_id, time=self.now, offers=offers))

    def preempted(self, reason: str) -> list[Decision]:
        """The scheduler took the current round's capacity back."""
        return self.feed(Preempted(job_id=self.job_id, time=self.now, round=self.state.round, reason=reason))

    def _node_of(self, name: str) -> str:
        moves = self.moves.get(name, 0)
        return f"{self.node}-{name}" + (f"-{moves}" if moves else "")

    # ---------------------------------------------------------- actuation

    def _record(self, decisions: list[Decision]) -> None:
        self.decisions.extend(TimedDecision(self.now, d) for d in decisions)

    def _start(self, names: Iterable[str]) -> None:
        for name in list(names):
            inst = self.state.instances[name]
            if name in self.current:
                self.previous[name] = self.current[name]
            self.current[name] = (self.state.round, inst.start)
            self.state, decisions = step(self.state, InstanceStarted(
                job_id=self.job_id, time=self.now, instance=name, round=self.state.round,
                start=inst.start, node=self._node_of(name)), self.now)
            self._record(decisions)

    def _execute(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if decision.kind in (DecisionKind.START_JOB, DecisionKind.RESTART_JOB, DecisionKind.RESUME_JOB):
                self._start(self.state.instances.keys())
            elif decision.kind is DecisionKind.RESTART_INSTANCE:
                self._start([decision.instance])
            elif decision.kind is DecisionKind.ISOLATE_NODE:
                # The runtime keeps new instances off the node: the ones there move to fresh nodes.
                for name in self.state.instances:
                    if self._node_of(name) == decision.node:
                        self.moves[name] = self.moves.get(name, 0) + 1

