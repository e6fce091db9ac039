"""The chaos soak's verdict (bench/soak.py): given what the soak collected
(the decisions topic, the actuator's records, the history, the webhooks the
receiver got, what the jobs' own instances wrote), which decisions were lost
or doubled, which jobs missed the outcome their faults call for, which
processes were left behind.

Pure: records in, a ``Verdict`` out; no clock, no bus, no files (the soak
reads those; tests/test_soak_check.py pins the inputs).

What counts as what:
  lost     a decision on the bus the actuator never recorded done; a decision
           (of a kind that writes one) with no history row, or whose row is
           still pending; a webhook an executed decision calls for that never
           arrived; a restart whose round no instance ever started.
  doubled  an action id recorded done twice; a history row no decision
           stands for; an incarnation (rank, round, start) started twice; two
           restart decisions for one round of a job; a round started that no
           restart called for; a webhook id delivered twice with no notifier
           kill in between (across a kill the same id again is at-least-once
           delivery, counted as ``redelivered``: receivers drop it by its id).
A decision published twice under one action id (a processor that took a job
over derives it again) is neither: the actuator executes an id once; it is
counted as ``republished``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Mapping

# Decisions the history gets no fault row for (trainwarden/actuator.py execute()).
WITHOUT_HISTORY_ROW = frozenset({"start_job", "resume_job", "complete_job", "queue_job"})


@dataclasses.dataclass(frozen=True)
class DecisionSeen:
    action_id: str
    job_id: str
    kind: str  # a DecisionKind value
    round: int = 0


@dataclasses.dataclass(frozen=True)
class HistoryRow:
    record_id: str  # the decision's action id
    job_id: str
    action: str
    result: str  # pending, done, failed, unsupported


@dataclasses.dataclass(frozen=True)
class JobSeen:
    job_id: str
    expected: str  # "succeeded", "failed"
    status: str  # the job record's: running, succeeded, failed ("" when none)
    reason: str = ""
    expected_reason: str = ""  # "" : any reason
    # Incarnations the job's instances wrote when they started: (rank, round, start) -> processes.
    starts: Mapping[tuple[int, int, int], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WebhookSeen:
    webhook_id: str
    at: float  # the soak's monotonic clock


@dataclasses.dataclass(frozen=True)
class Records:
    decided: tuple[DecisionSeen, ...]
    done: tuple[tuple[str, str], ...]  # (action id, job id) of the actuator's action_done records, every one
    history: tuple[HistoryRow, ...]  # the newest row of each record id
    jobs: tuple[JobSeen, ...]
    webhooks: tuple[WebhookSeen, ...] = ()
    expected_webhooks: Mapping[str, str] = dataclasses.field(default_factory=dict)  # webhook id -> action id
    notifier_kills: tuple[float, ...] = ()  # the soak's monotonic clock
    orphans: tuple[str, ...] = ()  # "pid job" of processes left after their job ended


@dataclasses.dataclass(frozen=True)
class Finding:
    what: str  # a short kind: "not executed", "executed twice", ...
    subject: str  # the action id, webhook id, job or process
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    decisions: int
    executed: int
    republished: int
    history_rows: int
    webhooks_expected: int
    webhooks_delivered: int
    redelivered: int
    lost: tuple[Finding, ...]
    doubled: tuple[Finding, ...]
    wrong_outcomes: tuple[Finding, ...]
    orphans: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.wrong_outcomes or self.orphans)


def check(records: Records) -> Verdict:
    ours = {job.job_id for job in records.jobs}
    decided = [d for d in records.decided if d.job_id in ours]
    by_id: dict[str, DecisionSeen] = {}
    for decision in decided:
        by_id.setdefault(decision.action_id, decision)
    done = Counter(action_id for action_id, job_id in records.done if job_id in ours)
    rows = {row.record_id: row for row in records.history if row.job_id in ours}
    lost: list[Finding] = []
    doubled: list[Finding] = []

    for action_id, decision in by_id.items():
        if done[action_id] == 0:
            lost.append(Finding("not executed", action_id, f"{decision.kind} of {decision.job_id}"))
        elif done[action_id] > 1:
            doubled.append(Finding("executed twice", action_id, f"{decision.kind}: {done[action_id]} done records"))
        if decision.kind not in WITHOUT_HISTORY_ROW:
            row = rows.get(action_id)
            if row is None:
                lost.append(Finding("no history row", action_id, f"{decision.kind} of {decision.job_id}"))
            elif row.result == "pending":
                lost.append(Finding("history row left pending", action_id, decision.kind))
    for action_id, count in done.items():
        if action_id not in by_id:
            doubled.append(Finding("executed, never decided", action_id, f"{count} done records"))
    for record_id, row in rows.items():
        if record_id not in by_id:
            doubled.append(Finding("history row without a decision", record_id, f"{row.action} of {row.job_id}"))

    restarts: dict[str, Counter] = {}
    for decision in by_id.values():
        if decision.kind == "restart_job":
            restarts.setdefault(decision.job_id, Counter())[decision.round] += 1
    wrong: list[Finding] = []
    for job in records.jobs:
        rounds = restarts.get(job.job_id, Counter())
        for round_, count in sorted(rounds.items()):
            if count > 1:
                doubled.append(Finding("restarted twice in one round", job.job_id, f"round {round_}: {count}"))
        for (rank, round_, start), processes in sorted(job.starts.items()):
            if processes > 1:
                doubled.append(Finding("incarnation started twice", job.job_id,
                                       f"rank {rank} round {round_} start {start}: {processes} processes"))
        started_rounds = {round_ for _, round_, _ in job.starts}
        called_for = {0} | {round_ + 1 for round_ in rounds}
        for round_ in sorted(started_rounds - called_for):
            doubled.append(Finding("round started without a restart", job.job_id, f"round {round_}"))
        for round_ in sorted(called_for - started_rounds):
            lost.append(Finding("restart whose round never started", job.job_id, f"round {round_}"))
        if job.status != job.expected or (job.expected_reason and job.reason != job.expected_reason):
            want = job.expected + (f" ({job.expected_reason})" if job.expected_reason else "")
            wrong.append(Finding("wrong outcome", job.job_id,
                                 f"expected {want}, got {job.status or 'no job record'} ({job.reason})"))

    delivered: dict[str, list[float]] = {}
    for hook in records.webhooks:
        delivered.setdefault(hook.webhook_id, []).append(hook.at)
    redelivered = 0
    expected = {w: a for w, a in records.expected_webhooks.items() if a in by_id}
    for webhook_id, action_id in expected.items():
        if webhook_id not in delivered:
            lost.append(Finding("webhook never delivered", webhook_id, f"for {action_id}"))
    for webhook_id, times in delivered.items():
        if webhook_id not in records.expected_webhooks:
            doubled.append(Finding("webhook no decision calls for", webhook_id))
        times = sorted(times)
        for earlier, later in zip(times, times[1:]):
            if _killed_between(records.notifier_kills, earlier, later):
                redelivered += 1
            else:
                doubled.append(Finding("webhook delivered twice", webhook_id, f"{later - earlier:.1f} s apart"))

    return Verdict(
        decisions=len(by_id), executed=sum(1 for a in by_id if done[a]), republished=len(decided) - len(by_id),
        history_rows=len(rows), webhooks_expected=len(expected),
        webhooks_delivered=sum(1 for w in expected if w in delivered), redelivered=redelivered,
        lost=tuple(lost), doubled=tuple(doubled), wrong_outcomes=tuple(wrong),
        orphans=tuple(Finding("orphan process", o) for o in records.orphans))


def _killed_between(kills: Iterable[float], earlier: float, later: float) -> bool:
    return any(earlier <= kill <= later for kill in kills)
