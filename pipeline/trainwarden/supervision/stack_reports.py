"""A hung job's stack report, on every runtime: whatever stops the instances
(this machine's runtime, each node's agent) dumps them first and hands the
dumps in per node; the report is built when every node has answered, or at
the deadline with the silent nodes named as missing."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from trainwarden.bus.messages import StackDumps, StackReportReady
from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S
from trainwarden.diagnose.report import StackReport, build_report
from trainwarden.diagnose.stacks import ProcessDump, dumps_from_json, dumps_to_json
from trainwarden.events import Decision
from trainwarden.store.records import StackReportRecord

# The agents' dumps are bounded by their own timeout; the rest is the bus.
WAIT_S = DEFAULT_TIMEOUT_S + 10.0


@dataclasses.dataclass
class _Pending:
    decision: Decision
    deadline: float
    expected: set = dataclasses.field(default_factory=set)
    answered: set = dataclasses.field(default_factory=set)
    dumps: list = dataclasses.field(default_factory=list)
    missing: list = dataclasses.field(default_factory=list)


class StackReports:
    def __init__(self, history, clock: Callable[[], float],
                 announce: Callable[[StackReportReady, StackReport], None] = lambda ready, report: None):
        self.history = history
        self.announce = announce
        self.clock = clock
        self.pending: dict[str, _Pending] = {}
        self.written = 0

    def start(self, decision: Decision) -> None:
        self.pending.setdefault(decision.action_id, _Pending(decision, self.clock() + WAIT_S))

    def expect(self, report_id: str, job_id: str, node: str) -> None:
        if report_id in self.pending:
            self.pending[report_id].expected.add(node)

    def hand_in(self, node: str, job_id: str, report_id: str, dumps: Sequence[ProcessDump],
                missing: Sequence[str]) -> None:
        """One node's dumps, taken in this process (the local runtime)."""
        self.add(StackDumps(node=node, job_id=job_id, report_id=report_id, time=self.clock(),
                            dumps_json=dumps_to_json(list(dumps)), missing=tuple(missing)))

    def add(self, message: StackDumps) -> None:
        pending = self.pending.get(message.report_id)
        if pending is None:
            return
        pending.answered.add(message.node)
        pending.missing.extend(message.missing)
        try:
            pending.dumps.extend(dumps_from_json(message.dumps_json))
        except (ValueError, KeyError, TypeError):
            pending.missing.append(f"{message.node}: unreadable dumps")
        if pending.expected and pending.expected <= pending.answered:
            self._write(message.report_id)

    def flush_due(self, now: float) -> None:
        for report_id, pending in list(self.pending.items()):
            if now >= pending.deadline:
                for node in sorted(pending.expected - pending.answered):
                    pending.missing.append(f"{node}: no stack dumps arrived in {WAIT_S:.0f} s")
                self._write(report_id)

    def _write(self, report_id: str) -> None:
        pending = self.pending.pop(report_id)
        pending.dumps.sort(key=lambda d: (d.instance, d.pid))
        report = build_report(pending.dumps, sorted(pending.missing))
        decision = pending.decision
        now = self.clock()
        self.written += 1
        # Announced first: a history that cannot take the report must not also cost the notification it.
        self.announce(StackReportReady(
            report_id=report_id, job_id=decision.job_id, time=now, tool=report.tool, processes=report.processes,
            groups=len(report.groups), suspects=tuple(report.suspects), verdict=report.verdict[:2000],
            missing=tuple(m[:500] for m in report.missing[:20])), report)
        self.history.write([StackReportRecord(
            report_id=report_id, record_id=report_id, job_id=decision.job_id, time=now, round=decision.round,
            tool=report.tool, processes=report.processes, groups=len(report.groups), suspects=",".join(report.suspects),
            verdict=report.verdict[:2000], missing="; ".join(report.missing)[:4000],
            report_json=report.to_json()[:1_000_000], updated_at=now)])
