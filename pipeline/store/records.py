"""Rows of the history: what the services write and the queries read.

Field names are the column names of the ClickHouse tables
(``pipeline/store/migrations``). Times are float seconds since the epoch here
and DateTime64(3, 'UTC') in the tables.
"""

from __future__ import annotations

import msgspec

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
