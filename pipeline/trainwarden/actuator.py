"""Executes the engine's decisions through a runtime, at most once each.

Every fault decision is written to the history twice: as ``pending`` when it
is taken, and as ``done`` (or ``failed``) with its duration once its action has
finished. Restarts also get stage timings: detected, decided, stopped,
restarted, and running (the first output line of the new incarnation).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from typing import Callable, Optional, Protocol, Sequence

import msgspec

from trainwarden import failpoint
from trainwarden.engine.spot import SPOT_STATES
from trainwarden.events import Decision, DecisionKind, ErrorSource, LogLine
from trainwarden.runtime.base import Capability, JobRuntime, NodeIsolation, Preemption
from trainwarden.store.records import FaultRecord, FaultResult, RestartStages, SpotTransition

# The decisions each capability carries out; a runtime without it records them as unsupported.
NEEDS = {
    DecisionKind.RESTART_JOB: Capability.RESTART_JOB,
    DecisionKind.RESTART_INSTANCE: Capability.RESTART_INSTANCE,
    DecisionKind.ISOLATE_NODE: Capability.ISOLATE_NODE,
    DecisionKind.REQUEUE: Capability.PREEMPT,
}


def wants_stack_report(decision: Decision) -> bool:
    """A hang that ends the round: its stacks are dumped before the instances are stopped."""
    return decision.error_source in (ErrorSource.HANG, ErrorSource.EXIT_HANG) and decision.kind in (
        DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB)


def ended_incarnations(decision: Decision) -> Optional[dict[str, tuple[int, int]]]:
    """The incarnations a restart ends, from the decision alone: each new
    incarnation's start index is one more than the one it replaces, which ran
    in the round the fault happened in. None where the decision does not say
    (a fail or completion ends whatever runs)."""
    if decision.kind is DecisionKind.RESTART_JOB and decision.starts:
        return {name: (decision.round, start - 1) for name, start in decision.starts}
    if decision.kind is DecisionKind.RESTART_INSTANCE and decision.next_start > 0:
        return {decision.instance: (decision.round, decision.next_start - 1)}
    return None


def started_incarnations(decision: Decision) -> tuple[tuple[str, int, int], ...]:
    """(instance, round, start) of every incarnation the decision starts."""
    if decision.kind in (DecisionKind.START_JOB, DecisionKind.RESUME_JOB):
        return tuple((name, decision.round, start) for name, start in decision.starts)
    if decision.kind is DecisionKind.RESTART_JOB:
        return tuple((name, decision.round + 1, start) for name, start in decision.starts)
    if decision.kind is DecisionKind.RESTART_INSTANCE and decision.instance:
        return ((decision.instance, decision.round, decision.next_start),)
    return ()


class HistoryWriter(Protocol):
    def write(self, records: Sequence[object]) -> None: ...


@dataclasses.dataclass
class _PendingRestart:
    decision: Decision
    stages: RestartStages
    waiting_for: dict  # instance -> (round, start) of the new incarnation


class Actuator:
    def __init__(self, runtime: JobRuntime, history: HistoryWriter, node: str,
                 clock: Callable[[], float] = time.time, executed: Optional[set] = None):
        self.runtime = runtime
        self.history = history
        self.node = node
        self.clock = clock
        # Shared by every job's actuator in the distributed service, and
        # rebuilt there from the actuator's state topic after a restart.
        self.executed: set[str] = set() if executed is None else executed
        self.duplicates = 0
        self.failures = 0
        self._restarts: list[_PendingRestart] = []
        # start index per instance: incremented on every start, mirrors the engine's.
        self._starts: dict[str, int] = {}
        # The history keeps the newest version of a record; two writes within
        # one millisecond must still be ordered.
        self._versions: dict[str, float] = {}

    def _start(self, name: str, round_: int, start: Optional[int] = None) -> tuple[int, int]:
        # The decision names the incarnation; counting here is the fallback.
        start = self._starts.get(name, -1) + 1 if start is None else start
        self._starts[name] = start
        self.runtime.start(name, round_, start)
        return round_, start

    def execute(self, decision: Decision, snapshot: str = "") -> None:
        """Carry out one decision, once. ``snapshot``: the report id under
        which the runtime dumps the stacks before it stops the instances."""
        if decision.action_id in self.executed:
            self.duplicates += 1
            return
        self.executed.add(decision.action_id)
        kind = decision.kind
        if decision.cost is not None:
            self._spot_transition(decision)
        if kind in (DecisionKind.START_JOB, DecisionKind.RESUME_JOB):
            starts = dict(decision.starts)
            for name in self.runtime.instance_names:
                self._start(name, decision.round, starts.get(name))
            return
        if kind is DecisionKind.COMPLETE_JOB:
            self.runtime.stop_all()  # e.g. parameter servers, which never exit by themselves
            return
        if kind is DecisionKind.QUEUE_JOB:
            return  # nothing to start until the market allows
        self._record(decision, FaultResult.PENDING, 0.0)
        needed = NEEDS.get(kind)
        if needed is not None and needed not in self.runtime.capabilities:
            self._record(decision, FaultResult.UNSUPPORTED, 0.0)
            return
        try:
            if kind is DecisionKind.RESTART_JOB:
                self._restart(decision, self.runtime.instance_names, decision.round + 1, dict(decision.starts),
                              snapshot)
            elif kind is DecisionKind.RESTART_INSTANCE:
                self._restart(decision, [decision.instance], decision.round, {decision.instance: decision.next_start})
            elif kind is DecisionKind.FAIL_JOB:
                self.runtime.stop_all(snapshot)
                self._record(decision, FaultResult.DONE, self.clock() - decision.detected_at)
            elif kind is DecisionKind.NOTIFY:
                self._record(decision, FaultResult.DONE, 0.0)
            elif kind is DecisionKind.REQUEUE:
                typing.cast(Preemption, self.runtime).preempt(decision.notice_s)  # declared PREEMPT
                self._record(decision, FaultResult.DONE, self.clock() - decision.detected_at)
            elif kind is DecisionKind.ISOLATE_NODE:
                typing.cast(NodeIsolation, self.runtime).isolate_node(decision.node, decision.reason.value)
                self._record(decision, FaultResult.DONE, self.clock() - decision.detected_at)
            else:
                self._record(decision, FaultResult.UNSUPPORTED, 0.0)
        except Exception:
            self.failures += 1
            self._record(decision, FaultResult.FAILED, self.clock() - decision.detected_at)
            raise

    def _restart(self, decision: Decision, names: Sequence[str], new_round: int, starts: dict,
                 snapshot: str = "") -> None:
        decided_at = self.clock()
        # The incarnations the decision was about, never the ones running now:
        # an action finished again after a crash must not stop the round it started.
        self.runtime.stop(names, snapshot, ended_incarnations(decision))
        failpoint.reach(f"between-stop-and-start:{decision.kind.value}")
        stopped_at = self.clock()
        waiting = {name: self._start(name, new_round, starts.get(name)) for name in names}
        restarted_at = self.clock()
        stages = RestartStages(
            record_id=decision.action_id, job_id=decision.job_id, round=decision.round,
            instance_name=decision.instance if decision.kind is DecisionKind.RESTART_INSTANCE else "",
            detected_at=decision.detected_at, decided_at=decided_at, stopped_at=stopped_at,
            restarted_at=restarted_at, running_at=0.0, updated_at=restarted_at,
        )
        self.history.write([stages])
        # Done once restarted; the record is updated again with the time until
        # the job runs again, if this actuator lives to see it.
        self._record(decision, FaultResult.DONE, restarted_at - decision.detected_at)
        # Carried out again (finished after a bus error): one pending restart, the newest.
        self._restarts = [p for p in self._restarts if p.decision.action_id != decision.action_id]
        self._restarts.append(_PendingRestart(decision, stages, waiting))

    def observe(self, event: LogLine) -> None:
        """The first line of a restarted incarnation marks it running again."""
        self.mark_running(event.instance, event.round, event.start, event.time)

    def mark_running(self, instance: str, round_: int, start: int, when: float) -> None:
        if not self._restarts:
            return
        for pending in list(self._restarts):
            if pending.waiting_for.get(instance) == (round_, start):
                self._complete(pending, when)

    def _complete(self, pending: _PendingRestart, running_at: Optional[float]) -> None:
        self._restarts.remove(pending)
        now = max(self.clock(), pending.stages.updated_at + 0.002)
        stages = msgspec.structs.replace(pending.stages, running_at=running_at or 0.0, updated_at=now)
        end = running_at or pending.stages.restarted_at
        self.history.write([stages])
        self._record(pending.decision, FaultResult.DONE, end - pending.decision.detected_at)

    def finish(self) -> None:
        """The job is over: restarts that never printed again are done without a running time."""
        for pending in list(self._restarts):
            self._complete(pending, None)

    def _spot_transition(self, decision: Decision) -> None:
        cost = decision.cost
        self.history.write([SpotTransition(
            record_id=decision.action_id, job_id=decision.job_id, time=decision.time, round=decision.round,
            state=SPOT_STATES.get(decision.kind, decision.kind.value), action=decision.kind.value,
            reason=decision.reason.value, message=decision.error_message, paid=cost.paid,
            on_demand=cost.on_demand, held_s=cost.held_s, queued_s=cost.queued_s,
            preemptions=cost.preemptions, resumes=cost.resumes, updated_at=self.clock())])

    def _record(self, decision: Decision, result: FaultResult, duration_s: float) -> None:
        now = max(self.clock(), self._versions.get(decision.action_id, 0.0) + 0.002)
        self._versions[decision.action_id] = now
        self.history.write([FaultRecord(
            record_id=decision.action_id, job_id=decision.job_id, time=decision.detected_at,
            round=decision.round, node_name=decision.node or (self.node if not decision.instance else ""),
            instance_name=decision.instance, error_code=decision.error_code,
            error_message=decision.error_message,
            error_source=decision.error_source.value if decision.error_source else "",
            action=decision.kind.value, result=result.value, duration_s=round(max(duration_s, 0.0), 3),
            reason=decision.reason.value, rule=decision.rule, classifier=decision.classifier,
            category=decision.category, error_signature=decision.error_signature, updated_at=now,
            verdict=decision.verdict, consequences="; ".join(decision.consequences),
            evidence=decision.evidence,
        )])
