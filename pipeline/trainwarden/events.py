"""The shared vocabulary: typed input events and typed decisions.

Everything that crosses a boundary (runtime -> engine, engine -> actuator,
bus, history) is one of these structs. They are msgspec structs so the same
definitions serve in-process use and the wire format (see ``trainwarden.bus.serde``).
Times are float seconds since the epoch and are always carried as data: nothing
here reads a clock. An event's ``time`` is on the clock of the process that
made it; the engine dates what it learns by the ``now`` it is given (the
deciding process's clock) and keeps ``time`` for the record.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Optional, Union

import msgspec


class Stream(str, enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"


class DecisionKind(str, enum.Enum):
    """What the engine asks the actuator to do."""

    # Not a fault: place and start every instance of a newly submitted job.
    START_JOB = "start_job"
    RESTART_JOB = "restart_job"
    RESTART_INSTANCE = "restart_instance"
    FAIL_JOB = "fail_job"
    ISOLATE_NODE = "isolate_node"
    REQUEUE = "requeue"
    NOTIFY = "notify"
    # Not a fault: the job is over and every remaining instance can be stopped.
    COMPLETE_JOB = "complete_job"
    # Spot jobs (not faults): the job waits in the bidding queue; a preempted
    # job starts again from its checkpoint once the market allows.
    QUEUE_JOB = "queue_job"
    RESUME_JOB = "resume_job"


FAULT_ACTIONS = (
    DecisionKind.RESTART_JOB,
    DecisionKind.RESTART_INSTANCE,
    DecisionKind.FAIL_JOB,
    DecisionKind.ISOLATE_NODE,
    DecisionKind.REQUEUE,
    DecisionKind.NOTIFY,
)


class ErrorSource(str, enum.Enum):
    INSTANCE_EXIT = "instance_exit"
    HANG = "hang"
    EXIT_HANG = "exit_hang"
    C4D = "c4d"
    PREEMPTION = "preemption"
    NODE_LOST = "node_lost"
    # A message sent by the training code through the SDK (custom messages).
    SDK = "sdk"


class Reason(str, enum.Enum):
    """Why a decision was taken; stored with every fault record.

    Rule files pick one of these for each response and limit, so the
    vocabulary stays closed while the rules stay declarative.
    """

    INSTANCE_FAILED = "instance_failed"
    RETRYABLE_FAILURE = "retryable_failure"
    NON_RETRYABLE_FAILURE = "non_retryable_failure"
    # The same unknown error (no evidence either way) again, past the rule
    # pack's unknown policy.
    UNKNOWN_FAILURE_REPEATED = "unknown_failure_repeated"
    POLICY_NEVER = "policy_never"
    CRITICAL_ROLE_FAILED = "critical_role_failed"
    JOB_HANG = "job_hang"
    EXIT_HANG = "exit_hang"
    RESTARTS_DISABLED = "restarts_disabled"
    RESTART_LIMIT_REACHED = "restart_limit_reached"
    INSTANCE_RESTART_LIMIT_REACHED = "instance_restart_limit_reached"
    SAME_ERROR_LIMIT_REACHED = "same_error_limit_reached"
    FAILURE_RATE_EXCEEDED = "failure_rate_exceeded"
    # Restart after restart, each failing before the job got further (a
    # crash loop): the fault comes from the job, whatever its verdict.
    NO_PROGRESS = "no_progress"
    # A not-retryable error the job never showed before, on weak evidence
    # (after progress, or before it on the words or exit code alone): one
    # restart (engine/operational.py).
    SECOND_CHANCE = "second_chance"
    # The same retryable error on the same node again: the node is isolated.
    NODE_FAULT = "node_fault"
    CUSTOM_MESSAGE = "custom_message"
    NODE_LOST = "node_lost"
    C4D_ERROR = "c4d_error"
    C4D_WARNING = "c4d_warning"
    C4D_INFO = "c4d_info"
    ADVICE_HANG_INTERVAL = "advice_hang_interval"
    JOB_SUBMITTED = "job_submitted"
    ALL_INSTANCES_SUCCEEDED = "all_instances_succeeded"
    INVALID_JOB = "invalid_job"
    ENGINE_ERROR = "engine_error"
    # Spot: the job waits for its bid to meet the price and for stock.
    SPOT_QUEUED = "spot_queued"
    # Spot: bid at or above the price and stock sufficient: instances granted.
    BID_ACCEPTED = "bid_accepted"
    # Spot: price above the bid or stock short: instances released. Any job:
    # the scheduler that runs it took its capacity back (Preempted).
    PREEMPTED = "preempted"


class InstanceSpec(msgspec.Struct, frozen=True):
    name: str  # e.g. "worker-1"
    role: str  # worker, ps, chief, master
    index: int  # index within the role
    rank: int  # global rank across the job


class RoleSpec(msgspec.Struct, frozen=True):
    name: str
    count: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


class SpotBid(msgspec.Struct, frozen=True):
    """One role's bid (SpotWithPriceLimit): a discount of the on-demand price
    or an absolute price limit, for ``count`` instances of a type."""

    role: str
    instance_type: str
    count: int
    discount: Optional[float] = None  # SpotDiscountLimit, 0.1..0.9
    price_limit: Optional[float] = None  # SpotPriceLimit
    # Pools that release on the average price rather than the current one.
    compare_average: bool = False
    pool: str = ""  # the market's pool of the instance type (check_bids): where a cluster runtime places the role


class SpotCost(msgspec.Struct, frozen=True):
    """What a spot job has cost so far: market price x time held per instance,
    against on-demand for the same instance hours."""

    paid: float = 0.0
    on_demand: float = 0.0
    held_s: float = 0.0  # seconds the job held its instances
    queued_s: float = 0.0  # seconds in the bidding queue
    preemptions: int = 0
    resumes: int = 0


class JobSpec(msgspec.Struct, frozen=True):
    """How to start the job's instances; carried to the actuator in START_JOB."""

    roles: tuple[RoleSpec, ...]
    workdir: str = ""
    env: tuple[tuple[str, str], ...] = ()
    stop_grace_s: float = 10.0
    checkpoint_dir: str = ""  # TRAINWARDEN_CHECKPOINT_DIR of every instance
    runtime: str = "agents"  # where the cluster runs it: a runtime's name in runtime/registry.py
    preload: tuple[str, ...] = ()  # modules a standby interpreter imports before it becomes an instance
    framework: str = ""  # pytorch, mpi, ...: for the jobs table (history --jobs) of a cluster job
    runtime_options: str = ""  # the job file's engine section (kubernetes:), JSON, read by its runtime's package
    spot_pools: tuple[tuple[str, str], ...] = ()  # spot role -> its market pool (submit's bids): its nodes

    def role(self, name: str) -> RoleSpec:
        return next(r for r in self.roles if r.name == name)


# ---------------------------------------------------------------- events


class JobSubmitted(msgspec.Struct, frozen=True, tag="job_submitted"):
    job_id: str
    time: float
    framework: str
    args: str
    instances: tuple[InstanceSpec, ...]
    spec: Optional[JobSpec] = None
    # Agents report how long each instance has been silent every second; the
    # hang detector then refuses to judge silence on stale reports.
    activity_reports: bool = False
    # Spot roles: the job waits in the bidding queue until the market allows.
    spot: tuple[SpotBid, ...] = ()


class InstanceStarted(msgspec.Struct, frozen=True, tag="instance_started"):
    job_id: str
    time: float
    instance: str
    round: int
    start: int  # how many times this instance was started before (0 first)
    node: str = ""
    pid: int = 0


class LogLine(msgspec.Struct, frozen=True, tag="log_line"):
    job_id: str
    time: float
    instance: str
    round: int
    start: int
    text: str
    stream: Stream = Stream.STDOUT
    # When the node agent that reported the instance read the line, on that
    # agent's clock (None: not known). Compared only with that agent's own
    # activity reports: a line no newer than the latest report's last output
    # is already counted in the silence the report carried (a line read again
    # after a takeover or a rebalance is not fresh output).
    said: Optional[float] = None


class InstanceExited(msgspec.Struct, frozen=True, tag="instance_exited"):
    job_id: str
    time: float
    instance: str
    round: int
    start: int
    exit_code: int  # signals are reported shell-style: 128 + signal number
    # The last lines of the instance's output, when the reporter kept them: an
    # exit judged on its own evidence does not depend on log delivery order.
    tail: Optional[tuple[str, ...]] = None


class Activity(msgspec.Struct, frozen=True):
    """One incarnation as its node agent last saw it. Its silence travels as
    a duration on the agent's own clock: the reader dates the last output by
    its own clock at arrival, never by comparing the agent's clock with its own."""

    instance: str
    round: int
    start: int
    # When it last printed (or started), on the agent's clock: for readers of
    # messages without ``silent_s``, which take ``time - last_output``.
    last_output: float
    # Seconds since it last printed (or started, if it has not), on the agent's clock.
    silent_s: Optional[float] = None
    # Whether it has printed a line since it started (None: the agent did not say).
    spoke: Optional[bool] = None

    def silence(self, reported_at: float) -> float:
        """Its silence when reported, in seconds: a difference of two times of
        one clock (the agent's) whichever version of the message this is."""
        silent = self.silent_s if self.silent_s is not None else reported_at - self.last_output
        return silent if silent > 0.0 else 0.0


class InstanceActivity(msgspec.Struct, frozen=True, tag="instance_activity"):
    """A node agent's report on the job's instances it runs (``time`` is the
    agent's, when it reported)."""

    job_id: str
    time: float
    node: str
    instances: tuple[Activity, ...]


class NodeLost(msgspec.Struct, frozen=True, tag="node_lost"):
    job_id: str
    time: float
    node: str
    instances: tuple[str, ...]


class Preempted(msgspec.Struct, frozen=True, tag="preempted"):
    """The scheduler that runs the job took its capacity back (requeued or
    preempted its allocation while the nodes were up): not a fault of the
    job. Said by the runtime that holds the allocation, from the scheduler's
    own state, never from the job's output."""

    job_id: str
    time: float
    round: int  # the round whose instances lost their capacity
    reason: str


class Diagnosis(msgspec.Struct, frozen=True, tag="diagnosis"):
    """A finding of a diagnostic agent (C4D) from its own trusted channel."""

    job_id: str
    time: float
    node: str
    source: str  # "c4d"
    kind: str  # RankCommHang, RankNonCommHang, RankCommSlow, RankNonCommSlow
    level: str  # Error, Warning, Info
    rank: int = -1
    detail: str = ""


class SdkOp(str, enum.Enum):
    CUSTOM_MESSAGE = "custom_message"
    SET_RETRYABLE_ERRORS = "set_retryable_errors"
    SET_HANG_INTERVAL = "set_hang_interval"
    REPORT_PROGRESS = "report_progress"


class SdkMessage(msgspec.Struct, frozen=True, tag="sdk_message"):
    job_id: str
    time: float
    instance: str
    round: int
    start: int
    op: SdkOp
    content: str = ""
    keywords: tuple[str, ...] = ()
    # For SET_HANG_INTERVAL: seconds, -1 to switch off, None for the job's default.
    interval: Optional[int] = None
    # For REPORT_PROGRESS: the job's own measure of how far it got (a step,
    # an iteration, a checkpoint's number); only its growth matters.
    step: Optional[int] = None


class Offer(msgspec.Struct, frozen=True):
    """The market for one instance type at one moment (prices per instance-hour)."""

    instance_type: str
    price: float
    stock: int
    on_demand: float
    average_price: float = 0.0  # 0 when the pool has none
    notice_s: float = 0.0  # advance notice the pool gives before a release


class MarketUpdate(msgspec.Struct, frozen=True, tag="market_update"):
    """A market observation, polled at the edge (run loop, simulator)."""

    job_id: str
    time: float
    offers: tuple[Offer, ...]


class Tick(msgspec.Struct, frozen=True, tag="tick"):
    job_id: str
    time: float


Event = Union[JobSubmitted, InstanceStarted, LogLine, InstanceExited, SdkMessage, Tick, InstanceActivity, NodeLost,
              Diagnosis, MarketUpdate, Preempted]


# ------------------------------------------------------------- decisions


class Decision(msgspec.Struct, frozen=True):
    kind: DecisionKind
    reason: Reason
    rule: str  # name of the rule (YAML) that decided
    job_id: str
    time: float
    round: int  # the round in which the fault happened
    action_id: str
    error_source: Optional[ErrorSource] = None
    instance: str = ""
    node: str = ""
    error_code: int = 0
    error_message: str = ""
    error_signature: str = ""
    category: str = ""
    classifier: str = ""  # the catalogue rule that judged the failure
    detected_at: float = 0.0  # when the fault was observed (decision time may be later)
    # For RESTART_INSTANCE: the start index the new incarnation will carry.
    next_start: int = 0
    # For START_JOB and RESTART_JOB: the start index of every instance's new
    # incarnation (the actuator needs no memory of its own to place them).
    starts: tuple[tuple[str, int], ...] = ()
    # For START_JOB: how to start the instances, and the job's settings string.
    spec: Optional[JobSpec] = None
    instances: tuple[InstanceSpec, ...] = ()
    args: str = ""
    # Spot jobs: the cost so far, on every lifecycle decision (queue, start,
    # requeue, resume, complete, fail).
    cost: Optional[SpotCost] = None
    # For REQUEUE: seconds of notice before the instances are released (0: none).
    notice_s: float = 0.0
    # Failures: the verdict (retryable, not_retryable, unknown) on the root
    # cause, and the failures judged to be its consequences ("worker-0",
    # "worker-0 rank 2"), each with its category.
    verdict: str = ""
    consequences: tuple[str, ...] = ()
    # Failures: the operational evidence weighed beside the verdict (phase,
    # progress, recurrence, node), in words (engine/operational.py).
    evidence: str = ""


def action_id(job_id: str, *parts: object) -> str:
    """A deterministic id: the same fault replayed gives the same id, so the
    actuator can execute each action at most once."""
    material = "\x1f".join([job_id, *(str(p) for p in parts)])
    return hashlib.sha256(material.encode()).hexdigest()[:20]
