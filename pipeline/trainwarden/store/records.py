"""Rows of the history: what the services write and the queries read.

Field names are the column names of the ClickHouse tables
(``pipeline/trainwarden/store/migrations``). Times are float seconds since the epoch here
and DateTime64(3, 'UTC') in the tables.
"""

from __future__ import annotations

import enum

import msgspec


class FaultResult(str, enum.Enum):
    """What became of a fault decision's action (``FaultRecord.result``)."""

    PENDING = "pending"  # decided, not yet carried out
    DONE = "done"
    FAILED = "failed"  # the runtime raised while carrying it out
    UNSUPPORTED = "unsupported"  # the job's runtime lacks the capability (isolating a node on one machine)

# The fields of a fault record that `trainwarden history --json` prints, in order.
FAULT_FIELDS = (
    "job_id", "time", "round", "node_name", "instance_name", "error_code",
    "error_message", "error_source", "action", "result", "duration_s",
)


class FaultRecord(msgspec.Struct, frozen=True):
    """One decision about a fault (or a notification). Written when decided
    with result ``pending`` and again when its action is done; the newest
    ``updated_at`` of a ``record_id`` wins."""

    record_id: str  # the decision's action id
    job_id: str
    time: float  # when the fault was detected
    round: int
    node_name: str
    instance_name: str
    error_code: int
    error_message: str
    error_source: str  # ErrorSource value
    action: str  # DecisionKind value
    result: str  # pending, done, failed
    duration_s: float  # detection until the action completed (restarts: running again)
    reason: str  # Reason value
    rule: str  # the deciding rule
    classifier: str  # the catalogue rule that judged the failure, if any
    category: str
    error_signature: str  # normalised, for "same error" and aggregation
    updated_at: float
    # The verdict on a failure (retryable, not_retryable, unknown) and the
    # failures judged to be its consequences, "; "-separated (migration 0006).
    verdict: str = ""
    consequences: str = ""
    # The operational evidence weighed beside the verdict: phase, progress,
    # recurrence, node (engine/operational.py; migration 0007).
    evidence: str = ""


class RestartStages(msgspec.Struct, frozen=True):
    """Stage timings of one restart (a job round, or one instance in Async mode).

    A stage time of 0 means "not reached yet"."""

    record_id: str  # the restart decision's action id
    job_id: str
    round: int  # the round that was restarted
    instance_name: str  # "" for a job restart
    detected_at: float
    decided_at: float
    stopped_at: float
    restarted_at: float
    running_at: float
    updated_at: float


class JobRecord(msgspec.Struct, frozen=True):
    job_id: str
    submitted_at: float
    finished_at: float  # 0 while running
    status: str  # running, succeeded, failed
    reason: str  # the final decision's reason
    framework: str
    args: str
    instances: int
    rounds: int  # job-level restarts
    node_name: str
    updated_at: float


class DeadLetter(msgspec.Struct, frozen=True):
    """An input that could not take effect, kept so nothing is silently lost."""

    time: float
    source: str  # where it came from (sdk, runtime, bus topic, ...)
    job_id: str
    error: str  # why it was refused
    payload: str  # the raw input, bounded


def to_row(record: msgspec.Struct) -> dict:
    return msgspec.structs.asdict(record)


class StackReportRecord(msgspec.Struct, frozen=True):
    """Stack snapshots of a hung job, grouped (pipeline/trainwarden/diagnose). One per hang
    (or exit hang) decision, linked to its fault record by ``record_id``."""

    report_id: str  # the hang decision's action id
    record_id: str  # the fault record it explains (same id today; kept separate on purpose)
    job_id: str
    time: float  # when the snapshot was taken
    round: int
    tool: str  # py-spy, pystack, or "" when none could run
    processes: int  # processes dumped
    groups: int  # distinct stacks
    suspects: str  # comma-separated instance names the report names as suspects
    verdict: str  # one line for people
    missing: str  # what could not be dumped, and why ("" when nothing)
    report_json: str  # the whole report (groups, stacks, threads) as JSON
    updated_at: float


class DiagnosisRecord(msgspec.Struct, frozen=True):
    """A finding of a diagnostic source: C4D lines, hang-interval advice."""

    diagnosis_id: str  # deterministic: same finding, same id
    job_id: str
    time: float
    node_name: str
    source: str  # c4d, advice
    kind: str  # RankCommHang, ..., hang_interval
    level: str  # Error, Warning, Info
    rank: int
    detail: str
    trusted: bool  # from the diagnostic channel (True) or the job's own output (False)
    action: str  # what was done: isolate_node+restart_job, notify, recorded
    updated_at: float


class DeliveryRecord(msgspec.Struct, frozen=True):
    """One notification delivery (an event to one subscription), pipeline/trainwarden/notify.
    Never holds a URL, a header or a secret: names, ids, counts and a
    redacted, bounded error text only."""

    delivery_id: str  # deterministic from (event id, subscription)
    event_id: str  # the webhook-id
    subscription: str
    job_id: str
    event_type: str
    time: float  # when the event happened
    attempts: int
    status: str  # a DeliveryStatus value
    http_status: int  # of the last attempt; 0 when there was no HTTP answer
    latency_ms: float  # of the last attempt
    error: str  # redacted and bounded; "" when delivered
    updated_at: float


class NodeEventRecord(msgspec.Struct, frozen=True):
    """A node's state changed (runtime/nodes.py): isolated, lost, or ready again."""

    event_id: str  # deterministic from (node, state, time): a replayed change is the same row
    node_name: str
    time: float
    state: str  # a NodeStatus value: ready, isolated, lost
    detail: str  # why (the decision's reason, "no heartbeat for 12 s", an operator's note)
    updated_at: float


class SpotTransition(msgspec.Struct, frozen=True):
    """One step of a spot job's life (queued, running, requeued, running
    again, succeeded or failed) with its cost so far. The newest row of a
    job holds what it paid and what on-demand would have cost."""

    record_id: str  # the decision's action id
    job_id: str
    time: float
    round: int
    state: str  # queued, running, requeued, succeeded, failed
    action: str  # DecisionKind value
    reason: str  # Reason value
    message: str
    paid: float  # market price x time held per instance, so far
    on_demand: float  # what the same instance hours cost on demand
    held_s: float
    queued_s: float
    preemptions: int
    resumes: int
    updated_at: float
