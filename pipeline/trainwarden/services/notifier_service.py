"""``trainwarden notifier``: the processor's decisions, as webhook events.

It reads the decisions topic in its own consumer group, so it neither slows
nor depends on the actuator. A hang decision waits for the actuator's stack
report (the agents dump the stacks before the restart) up to the report's
deadline, and the job's later decisions wait behind it: a receiver sees a
job's events in decision order, the hang with its suspects.

Offsets are committed only when nothing is held back, after the events are in
the durable queue; a crash replays from the last commit and the queue drops
what it already has (same event id, same delivery id), so every event is
delivered once per subscription.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional

from trainwarden.bus import ACTUATOR_STATE, DEAD_LETTERS, DECISIONS, PREFIX, Bus, Message
from trainwarden.bus.messages import StackReportReady
from trainwarden.bus.serde import DecodeError, dead_letter, decode
from trainwarden.clock import now as clock_now
from trainwarden.events import Decision, DecisionKind, ErrorSource
from trainwarden.notify.bridge import DecisionNotifications, report_summary
from trainwarden.supervision.stack_reports import WAIT_S

GROUP = f"{PREFIX}-notifier"
# The actuator writes the report at its own deadline at the latest; the rest is the bus.
REPORT_WAIT_S = WAIT_S + 5.0
MAX_AGE_S = 3600.0  # decisions older than this when first read are history, not news
REPORTS_KEPT = 1000


@dataclasses.dataclass
class NotifierCounters:
    decisions: int = 0
    notified: int = 0
    too_old: int = 0
    held_for_report: int = 0
    report_timeouts: int = 0
    submit_errors: int = 0
    dead_letters: int = 0


@dataclasses.dataclass
class _Held:
    decision: Decision
    deadline: float  # for a hang decision: when to send without its report


def waits_for_report(decision: Decision) -> bool:
    return decision.error_source in (ErrorSource.HANG, ErrorSource.EXIT_HANG) and decision.kind in (
        DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB)


class NotifierService:
    def __init__(self, bus: Bus, notifications: DecisionNotifications, clock: Callable[[], float] = clock_now,
                 group: str = GROUP, max_age_s: float = MAX_AGE_S):
        self.notifications = notifications
        self.clock = clock
        self.max_age_s = max_age_s
        self.counters = NotifierCounters()
        self.reports: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.held: dict[str, collections.deque[_Held]] = {}  # job id -> its decisions not yet notified
        self.producer = bus.producer()
        self.state = bus.consumer([ACTUATOR_STATE], None, from_beginning=True)
        self.decisions = bus.consumer([DECISIONS], group, from_beginning=True)
        self._uncommitted = False

    def run_once(self, timeout_s: float = 0.1) -> None:
        for record in self.state.poll(0.0, max_records=5000):
            self._state_record(record)
        for record in self.decisions.poll(timeout_s, max_records=500):
            self._uncommitted = True
            self._decision(record)
        self._release(self.clock())
        self.producer.flush()
        if self._uncommitted and not self.held:
            self.decisions.commit()
            self._uncommitted = False

    def replace_notifications(self, make: Callable[[], DecisionNotifications]) -> None:
        """New subscriptions (a reload): the current notifier stops and leaves
        its queue on disk (held messages stay held), and ``make()`` opens the
        same queue directory with the new ones."""
        self.notifications.close(release_held=False)
        self.notifications = make()

    def close(self) -> None:
        self.notifications.close(release_held=False)
        self.producer.flush(5)
        for consumer in (self.decisions, self.state):
            consumer.close()
        self.producer.close()

    def _state_record(self, record: Message) -> None:
        try:
            message = decode(ACTUATOR_STATE, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if isinstance(message, StackReportReady):
            self.reports[message.report_id] = report_summary(
                message.tool, message.processes, message.groups, message.suspects, message.verdict, message.missing)
            while len(self.reports) > REPORTS_KEPT:
                self.reports.popitem(last=False)

    def _decision(self, record: Message) -> None:
        try:
            decision: Decision = decode(DECISIONS, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if not isinstance(decision, Decision):
            return  # the processor's history rows, for the actuator
        self.counters.decisions += 1
        now = self.clock()
        if decision.time < now - self.max_age_s:
            self.counters.too_old += 1
            return
        queue = self.held.setdefault(decision.job_id, collections.deque())
        if waits_for_report(decision):
            self.counters.held_for_report += 1
        queue.append(_Held(decision, now + REPORT_WAIT_S))

    def _release(self, now: float) -> None:
        for job_id, queue in list(self.held.items()):
            while queue:
                head = queue[0]
                report: Optional[dict] = None
                if waits_for_report(head.decision):
                    report = self.reports.get(head.decision.action_id)
                    if report is None and now < head.deadline:
                        break  # this job's later decisions wait behind it
                    if report is None:
                        self.counters.report_timeouts += 1
                try:
                    queued = self.notifications.submit(head.decision, report)
                except Exception as exc:  # noqa: BLE001 - kept and retried; offsets stay uncommitted
                    self.counters.submit_errors += 1
                    self.notifications.info(f"events of {head.decision.kind.value} for {job_id} could not be "
                                            f"queued ({type(exc).__name__}); retrying")
                    break
                queue.popleft()
                self.counters.notified += queued > 0
            if not queue:
                del self.held[job_id]

    def _dead_letter(self, record: Message, error: str) -> None:
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, "notifier", dead_letter(record, "notifier", error, self.clock()))
