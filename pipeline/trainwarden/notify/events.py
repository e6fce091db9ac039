"""The notification vocabulary: stable dotted event types and their payload.

Pure: no clock, no I/O. An engine ``Decision`` becomes one or more
``NotificationEvent``s (an observation such as ``hang.detected`` first, then
the action such as ``job.restarted``). The payload follows the Standard
Webhooks shape ``{type, timestamp, data}``; ``data.schema_version`` is bumped
on any incompatible change (docs/EVENTS.md is the contract).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
from typing import Any, Optional

import msgspec

from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason, SpotCost

SCHEMA_VERSION = 1
# Bounds that keep one event (and so one queue entry and one message) small
# whatever the job printed or the caller put into the context.
MAX_TEXT = 4000
MAX_DETAILS_BYTES = 16 * 1024
MAX_JOB_FIELDS = 32


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_ORDER.index(self)


_SEVERITY_ORDER = (Severity.INFO, Severity.WARNING, Severity.ERROR, Severity.CRITICAL)

# type -> severity. The order is the documentation order (docs/EVENTS.md).
EVENT_TYPES: dict[str, Severity] = {
    "job.restarted": Severity.WARNING,
    "instance.restarted": Severity.WARNING,
    "job.failed": Severity.CRITICAL,
    "job.succeeded": Severity.INFO,
    "node.isolated": Severity.ERROR,
    "node.lost": Severity.ERROR,
    "hang.detected": Severity.ERROR,
    "exit_hang.detected": Severity.ERROR,
    "c4d.warning": Severity.WARNING,
    "job.requeued": Severity.WARNING,
    "job.resumed": Severity.INFO,
    "custom.message": Severity.WARNING,
    "advice.hang_interval": Severity.INFO,
}

# Observations that explain an action; they come before it, in the same decision.
_OBSERVED_BY_SOURCE = {
    ErrorSource.HANG: "hang.detected",
    ErrorSource.EXIT_HANG: "exit_hang.detected",
    ErrorSource.NODE_LOST: "node.lost",
}
_ACTION_TYPES = {
    DecisionKind.RESTART_JOB: "job.restarted",
    DecisionKind.RESTART_INSTANCE: "instance.restarted",
    DecisionKind.FAIL_JOB: "job.failed",
    DecisionKind.COMPLETE_JOB: "job.succeeded",
    DecisionKind.ISOLATE_NODE: "node.isolated",
    DecisionKind.REQUEUE: "job.requeued",
    DecisionKind.RESUME_JOB: "job.resumed",
}
# The reserved keys of ``job_context``; every other scalar goes to ``data.job``.
_RESERVED_CONTEXT = ("details", "stack_report")


class NotificationEvent(msgspec.Struct, frozen=True):
    """One event. A msgspec struct so it can cross the bus later unchanged."""

    id: str  # deterministic: the webhook-id, receivers dedupe by it
    type: str
    time: float  # when it happened (the decision's time), seconds since the epoch
    job_id: str
    severity: str
    summary: str  # one line for people
    round: int = 0
    instance: str = ""
    node: str = ""
    action: str = ""  # the DecisionKind value, "" for observations without a decision
    action_id: str = ""
    reason: str = ""
    rule: str = ""
    error_source: str = ""
    error_code: int = 0
    message: str = ""
    category: str = ""
    classifier: str = ""
    detected_at: float = 0.0
    job: dict[str, Any] = {}
    details: Optional[dict[str, Any]] = None

    def payload(self, suppressed: int = 0, suppressed_since: float = 0.0) -> dict:
        """The Standard Webhooks payload; ``suppressed`` is the number of events of the
        same (subscription, job, type) that were not sent since the previous message."""
        return {
            "type": self.type,
            "timestamp": iso(self.time),
            "data": {
                "schema_version": SCHEMA_VERSION,
                "event_id": self.id,
                "job_id": self.job_id,
                "severity": self.severity,
                "summary": self.summary,
                "round": self.round,
                "instance": self.instance,
                "node": self.node,
                "action": self.action,
                "action_id": self.action_id,
                "reason": self.reason,
                "rule": self.rule,
                "error_source": self.error_source,
                "error_code": self.error_code,
                "message": self.message,
                "category": self.category,
                "classifier": self.classifier,
                "detected_at": iso(self.detected_at or self.time),
                "job": dict(self.job),
                "details": self.details,
                "suppressed_count": suppressed,
                "suppressed_since": iso(suppressed_since) if suppressed else None,
            },
        }


def iso(ts: float) -> str:
    """RFC 3339 UTC with milliseconds, the timestamp form Standard Webhooks uses."""
    moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def event_id(source_id: str, event_type: str) -> str:
    """The same decision always gives the same id per type: a replayed or
    redelivered decision is recognised by the queue and by receivers."""
    return "evt_" + hashlib.sha256(f"{source_id}\x1f{event_type}".encode()).hexdigest()[:32]


def event_types_for(decision: Decision) -> list[str]:
    kind = decision.kind
    if kind is DecisionKind.START_JOB:
        return []
    if kind is DecisionKind.NOTIFY:
        if decision.reason is Reason.ADVICE_HANG_INTERVAL:
            return ["advice.hang_interval"]
        if decision.reason is Reason.C4D_INFO:
            return []  # Info findings are recorded in the history, not announced
        c4d = decision.error_source is ErrorSource.C4D or decision.reason is Reason.C4D_WARNING
        return ["c4d.warning" if c4d else "custom.message"]
    types = []
    observed = _OBSERVED_BY_SOURCE.get(decision.error_source) if decision.error_source else None
    if observed and kind in (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE, DecisionKind.FAIL_JOB,
                             DecisionKind.REQUEUE):
        types.append(observed)
    action = _ACTION_TYPES.get(kind)
    if action:
        types.append(action)
    return types


def events_from_decision(decision: Decision, job_context: Optional[dict] = None) -> list[NotificationEvent]:
    """The events one engine decision stands for, observation first.

    ``job_context`` is optional: scalar values (framework, mode, restarts...)
    land in ``data.job``; ``details`` (a mapping) is attached to every event of
    the decision; ``stack_report`` (a mapping, e.g. tool, verdict, suspects)
    is attached to ``hang.detected`` and ``exit_hang.detected``.
    """
    context = job_context or {}
    job = _job_fields(context)
    events = []
    for event_type in event_types_for(decision):
        details = dict(context["details"]) if isinstance(context.get("details"), dict) else {}
        if event_type in ("hang.detected", "exit_hang.detected") and isinstance(context.get("stack_report"), dict):
            details["stack_report"] = context["stack_report"]
        if decision.cost is not None:  # spot jobs: what they paid so far, against on-demand
            details["cost"] = msgspec.structs.asdict(decision.cost)
            if decision.notice_s:
                details["notice_s"] = decision.notice_s
        events.append(NotificationEvent(
            id=event_id(decision.action_id, event_type),
            type=event_type,
            time=decision.time,
            job_id=decision.job_id,
            severity=EVENT_TYPES[event_type].value,
            summary=_summary(event_type, decision),
            round=decision.round,
            instance=decision.instance,
            node=decision.node,
            action=decision.kind.value,
            action_id=decision.action_id,
            reason=decision.reason.value,
            rule=decision.rule,
            error_source=decision.error_source.value if decision.error_source else "",
            error_code=decision.error_code,
            message=decision.error_message[:MAX_TEXT],
            category=decision.category,
            classifier=decision.classifier,
            detected_at=decision.detected_at,
            job=job,
            details=_bounded(details),
        ))
    return events


def sample_event(event_type: str, job_id: str = "sample-job", time: float = 1_764_400_000.0,
                 with_details: bool = True, source_id: str = "") -> NotificationEvent:
    """A fully populated event of this type: ``notify test`` sends it, and
    validation renders every template with it (with and without details).
    Its id derives from ``source_id`` (default: the job id)."""
    source = source_id or f"sample-{job_id}"
    decision = _SAMPLE_DECISIONS[event_type]
    decision = msgspec.structs.replace(decision, job_id=job_id, time=time, detected_at=time - 0.5,
                                       action_id=f"{source}-{decision.kind.value}")
    event = next(e for e in events_from_decision(decision, _SAMPLE_CONTEXT) if e.type == event_type)
    if not with_details:
        event = msgspec.structs.replace(event, details=None)
    elif event.details is None:
        event = msgspec.structs.replace(event, details={"note": "sample details"})
    return event


# ----------------------------------------------------------------- helpers


def _line(text: str, limit: int = 200) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _summary(event_type: str, d: Decision) -> str:
    who = f"{d.instance} " if d.instance else ""
    code = f" (exit code {d.error_code})" if d.error_code else ""
    why = f": {_line(d.error_message)}" if d.error_message else ""
    cause = {
        ErrorSource.INSTANCE_EXIT: f"{who}failed{code}",
        ErrorSource.HANG: "a hang",
        ErrorSource.EXIT_HANG: "an exit hang",
        ErrorSource.NODE_LOST: f"node {d.node} lost",
        ErrorSource.C4D: f"C4D on node {d.node}",
        ErrorSource.PREEMPTION: "a preemption",
        ErrorSource.SDK: f"a message from {who.strip() or 'the job'}",
    }.get(d.error_source, d.reason.value) if d.error_source else d.reason.value
    job = d.job_id
    texts = {
        "job.restarted": f"{job}: job restarted after {cause} (round {d.round} → {d.round + 1}){why}",
        "instance.restarted": f"{job}: {d.instance} restarted after {cause}{why}",
        "job.failed": f"{job}: job failed ({d.reason.value}) after {cause}{why}",
        "job.succeeded": f"{job}: job succeeded (round {d.round})" + _paid(d),
        "node.isolated": f"{job}: node {d.node} isolated ({d.reason.value}){why}",
        "node.lost": f"{job}: node {d.node} lost" + (f" with {d.instance}" if d.instance else ""),
        "hang.detected": f"{job}: hang detected in round {d.round}{why}",
        "exit_hang.detected": f"{job}: exit hang detected in round {d.round}{why}",
        "c4d.warning": f"{job}: C4D warning{why}",
        "job.requeued": f"{job}: job requeued after {cause}{why}",
        "job.resumed": f"{job}: job resumed in round {d.round}" + _paid(d),
        "custom.message": f"{job}: message from {d.instance or 'the job'}{why}",
        "advice.hang_interval": f"{job}: hang interval advice{why}",
    }
    return texts[event_type][:MAX_TEXT]


def _paid(d: Decision) -> str:
    if d.cost is None or not d.cost.on_demand:
        return ""
    saved = 1 - d.cost.paid / d.cost.on_demand
    return f"; paid {d.cost.paid:.2f} vs {d.cost.on_demand:.2f} on demand ({saved:.0%} saved)"


def _job_fields(context: dict) -> dict:
    """Scalars only, bounded: the context must not smuggle large or odd values into messages."""
    job: dict[str, Any] = {}
    for key in sorted(context):
        if key in _RESERVED_CONTEXT or not isinstance(key, str) or len(job) >= MAX_JOB_FIELDS:
            continue
        value = context[key]
        if isinstance(value, str):
            job[key] = value[:1000]
        elif value is None or isinstance(value, (bool, int, float)):
            job[key] = value
    return job


def _bounded(details: dict) -> Optional[dict]:
    if not details:
        return None
    try:
        size = len(msgspec.json.encode(details))
    except (TypeError, msgspec.EncodeError):
        return {"error": "details could not be encoded as JSON"}
    if size > MAX_DETAILS_BYTES:
        return {"truncated": True, "bytes": size, "keys": sorted(str(k) for k in details)[:20]}
    # Round-trip so the event holds plain JSON values only (msgspec structs, tuples...).
    return msgspec.json.decode(msgspec.json.encode(details))


def _sample(kind: DecisionKind, reason: Reason, source: Optional[ErrorSource], **fields) -> Decision:
    base = dict(rule="sample_rule", job_id="sample-job", time=0.0, round=1, action_id=f"sample-{kind.value}",
                error_source=source, instance="worker-1", node="node-a", error_code=1,
                error_message="RuntimeError: NCCL error: unhandled system error", error_signature="1:nccl_error",
                category="collective_error", classifier="nccl_error")
    base.update(fields)
    return Decision(kind=kind, reason=reason, **base)


_SAMPLE_CONTEXT = {"framework": "pytorch", "mode": "Sync", "restarts": 1, "max_restarts": 3,
                   "stack_report": {"tool": "py-spy", "processes": 2, "groups": 1, "suspects": ["worker-1"],
                                    "verdict": "every rank waits in allreduce; worker-1 never entered it"}}
_SAMPLE_DECISIONS = {
    "job.restarted": _sample(DecisionKind.RESTART_JOB, Reason.RETRYABLE_FAILURE, ErrorSource.INSTANCE_EXIT),
    "instance.restarted": _sample(DecisionKind.RESTART_INSTANCE, Reason.RETRYABLE_FAILURE,
                                  ErrorSource.INSTANCE_EXIT),
    "job.failed": _sample(DecisionKind.FAIL_JOB, Reason.RESTART_LIMIT_REACHED, ErrorSource.INSTANCE_EXIT),
    "job.succeeded": _sample(DecisionKind.COMPLETE_JOB, Reason.ALL_INSTANCES_SUCCEEDED, None, instance="", node="",
                             error_code=0, error_message="", category="", classifier=""),
    "node.isolated": _sample(DecisionKind.ISOLATE_NODE, Reason.C4D_ERROR, ErrorSource.C4D, instance="",
                             error_code=0, error_message="C4D Error RankCommHang on node node-a (rank 3)"),
    "node.lost": _sample(DecisionKind.RESTART_JOB, Reason.NODE_LOST, ErrorSource.NODE_LOST, error_code=0,
                         error_message="node node-a stopped sending heartbeats"),
    "hang.detected": _sample(DecisionKind.RESTART_JOB, Reason.JOB_HANG, ErrorSource.HANG, instance="", error_code=0,
                             error_message="every instance silent for 600 s", category="hang", classifier=""),
    "exit_hang.detected": _sample(DecisionKind.RESTART_JOB, Reason.EXIT_HANG, ErrorSource.EXIT_HANG,
                                  error_code=0, error_message="worker-0 exited 600 s ago; others still run",
                                  category="exit_hang", classifier=""),
    "c4d.warning": _sample(DecisionKind.NOTIFY, Reason.C4D_WARNING, ErrorSource.C4D, instance="", error_code=0,
                           error_message="C4D Warning RankCommSlow on node node-a (rank 3)"),
    "job.requeued": _sample(DecisionKind.REQUEUE, Reason.PREEMPTED, ErrorSource.PREEMPTION, instance="", node="",
                            error_code=0, error_message="spot price 0.52 rose above the bid 0.45 (p4d.24xlarge)",
                            category="preemption", classifier="", error_signature="preemption",
                            cost=SpotCost(paid=12.6, on_demand=42.0, held_s=3600.0, queued_s=120.0, preemptions=1)),
    "job.resumed": _sample(DecisionKind.RESUME_JOB, Reason.BID_ACCEPTED, None, instance="", node="", round=2,
                           error_code=0, error_message="", category="", classifier="", error_signature="",
                           cost=SpotCost(paid=12.6, on_demand=42.0, held_s=3600.0, queued_s=480.0, preemptions=1,
                                         resumes=1)),
    "advice.hang_interval": _sample(DecisionKind.NOTIFY, Reason.ADVICE_HANG_INTERVAL, None, instance="worker-0",
                                    error_code=0, category="", classifier="", error_signature="",
                                    error_message="job_hang_interval 1800 s is at or above the collective timeout "
                                                  "1800 s seen in worker-0's output: use 1500 s"),
    "custom.message": _sample(DecisionKind.NOTIFY, Reason.CUSTOM_MESSAGE, ErrorSource.SDK, error_code=0,
                              error_message="The training loss of the job is NaN.", category="custom_message",
                              classifier=""),
}
