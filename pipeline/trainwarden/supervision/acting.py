"""The acting half of supervision, the same for ``trainwarden run`` and the
cluster's actuator service: for one job, every decision is carried out once
through the job's runtime (a hang's stacks dumped first), its history rows
written, and its notification submitted.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence

from trainwarden.actuator import Actuator, HistoryWriter, wants_stack_report
from trainwarden.engine import JobStatus
from trainwarden.events import Decision, DecisionKind, LogLine
from trainwarden.runtime.base import Capability, JobRuntime
from trainwarden.store.records import JobRecord
from trainwarden.supervision.stack_reports import StackReports


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What the jobs table says of a job besides its status."""

    job_id: str
    submitted_at: float
    framework: str
    args: str
    instances: int
    node_name: str  # where it is supervised: this machine for ``run``, "" for the cluster


FINAL = {DecisionKind.FAIL_JOB: JobStatus.FAILED, DecisionKind.COMPLETE_JOB: JobStatus.SUCCEEDED}


class Supervisor:
    def __init__(self, runtime: JobRuntime, history: HistoryWriter, reports: StackReports, facts: JobFacts, *,
                 node: str, clock: Callable[[], float], executed: Optional[set] = None,
                 notify: Optional[Callable[[Decision], None]] = None):
        self.runtime = runtime
        self.history = history
        self.reports = reports
        self.facts = facts
        self.clock = clock
        self.notify = notify
        self.actuator = Actuator(runtime, history, node, clock=clock, executed=executed)
        self.status = JobStatus.RUNNING
        # The jobs table's ``rounds``, the same on every runtime: the job
        # restarts carried out (RESTART_JOB, whatever its reason: a
        # preemption's too, though no limit counts it; never an instance's
        # restart or a spot job's re-queue), by action id, so that one
        # finished by a new actuator counts once. Counted here alone: the
        # engine's ``job_restarts`` is what its limits count, not this.
        self.restart_ids: set[str] = set()
        self.restarts = 0
        self.reason = ""

    def count_restarts(self, action_ids: Iterable[str]) -> None:
        """Job restarts carried out (or under way) before this supervisor
        existed: a new actuator's durable records."""
        self.restart_ids.update(action_ids)
        self.restarts = max(self.restarts, len(self.restart_ids))

    def act(self, decision: Decision, dump_stacks: bool = True) -> None:
        """Carry out one decision (at most once, by its action id).
        ``dump_stacks``: False when a hang's stack report already exists
        (an action finished after a crash must not replace it by an empty one)."""
        snapshot = ""
        if dump_stacks and wants_stack_report(decision) and Capability.STACK_DUMP in self.runtime.capabilities:
            snapshot = decision.action_id
            self.reports.start(decision)
        restart = decision.kind is DecisionKind.RESTART_JOB and decision.action_id not in self.actuator.executed
        if restart:
            self.count_restarts([decision.action_id])
        try:
            self.actuator.execute(decision, snapshot)
        finally:
            if self.notify is not None:
                self.notify(decision)
        if restart:
            self.write_job(self.status)  # the jobs table counts it now, not only once the job is over
        final = FINAL.get(decision.kind)
        if final is not None and self.status is JobStatus.RUNNING:
            self.reason = decision.reason.value
            self.write_job(final)

    def keep(self, records: Sequence[object]) -> None:
        """Rows the intake derived: dead letters, diagnoses."""
        if records:
            self.history.write(list(records))

    def observe(self, line: LogLine) -> None:
        self.actuator.observe(line)

    def mark_running(self, instance: str, round_: int, start: int, when: float) -> None:
        self.actuator.mark_running(instance, round_, start, when)

    def write_job(self, status: JobStatus, reason: Optional[str] = None) -> None:
        self.status = status
        if reason is not None:
            self.reason = reason
        now = self.clock()
        facts = self.facts
        self.history.write([JobRecord(
            job_id=facts.job_id, submitted_at=facts.submitted_at,
            finished_at=0.0 if status is JobStatus.RUNNING else now, status=status.value, reason=self.reason,
            framework=facts.framework, args=facts.args, instances=facts.instances, rounds=self.restarts,
            node_name=facts.node_name, updated_at=now)])

    def finish(self) -> None:
        """The job is over: restarts that never printed again are done."""
        self.actuator.finish()
