"""The engine's memory of one job.

Mutable for speed (a 10,000-instance job receives millions of log lines), but
owned by the caller and changed only by ``engine.step``; nothing in it reads
a clock or touches I/O. ``copy.deepcopy`` gives a snapshot for replay.

Every time a timer compares with ``now`` (started_at, last_output,
reported_at, first_success_exit, a failure window) is on the deciding
process's clock: the ``now`` at which it learned of the evidence.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Optional

from trainwarden.events import InstanceSpec, JobSpec, SpotBid
from trainwarden.rules.model import RulePack
from trainwarden.settings import JobSettings

# Roles that run until told to stop (TensorFlow parameter servers); the job is
# done when every other instance has succeeded.
NON_FINISHING_ROLES = frozenset({"ps"})
# The rule of the row that counts dropped custom messages (engine/messages.py);
# applying it sets the count back.
DROPPED_MESSAGES_RULE = "custom_messages_dropped"


class InstanceStatus(str, enum.Enum):
    PENDING = "pending"  # asked to start, not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class JobStatus(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # Stopped by the operator (an interrupt of ``run``): the host's verdict, never the engine's.
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class FailureMemory:
    """The latest failure (engine/operational.py): its error, node and step,
    how many times in a row it came without progress between (1: the
    first), how many times in a row on this node, and the nodes it came
    on in that row."""

    signature: str
    node: str
    step: int
    repeats: int
    node_repeats: int
    nodes: tuple[str, ...]


@dataclasses.dataclass(slots=True)
class InstanceState:
    spec: InstanceSpec
    tail: collections.deque
    status: InstanceStatus = InstanceStatus.PENDING
    start: int = 0  # the start index whose events are current
    node: str = ""
    pid: int = 0
    # When its start, and its latest output, became known (the deciding clock).
    started_at: float = 0.0
    last_output: float = 0.0
    # SDK override of the hang interval: None = the job's, -1 = off.
    hang_interval: Optional[int] = None
    restarts: int = 0  # instance-level restarts so far
    error_counts: dict = dataclasses.field(default_factory=dict)
    ever_failed: bool = False
    # When a node agent's latest report on this incarnation arrived (jobs with activity reports).
    reported_at: float = 0.0
    # That report's last output, on the reporting agent's clock (never compared with the deciding clock).
    reported_output: Optional[float] = None
    # Whether this incarnation has printed a line (or called the SDK) yet:
    # before that, silence is judged against the start-up allowance.
    spoke: bool = False
    # engine/progress.py: the highest step this instance reported, that
    # step when its incarnation began, and its restarts in a row that made
    # no progress (Async instance restarts).
    best_step: int = -1
    best_at_start: int = -1
    no_progress_restarts: int = 0
    # engine/operational.py: this instance's latest failure (Async jobs).
    last_failure: Optional[FailureMemory] = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> str:
        return self.spec.role


class SpotPhase(str, enum.Enum):
    QUEUED = "queued"  # in the bidding queue: no instances held
    RUNNING = "running"  # instances held and billed
    DONE = "done"


@dataclasses.dataclass(slots=True)
class SpotState:
    """A spot job's place in the market and what it has cost so far."""

    bids: tuple[SpotBid, ...]
    # With fault tolerance off (--fault-tolerant-policy=Never) a preemption fails the job.
    fault_tolerant: bool
    since: float  # when cost was last accrued
    spec: Optional[JobSpec] = None
    instances: tuple = ()
    args: str = ""
    phase: SpotPhase = SpotPhase.QUEUED
    started: bool = False
    offers: dict = dataclasses.field(default_factory=dict)  # instance type -> Offer
    paid: float = 0.0
    on_demand: float = 0.0
    held_s: float = 0.0
    queued_s: float = 0.0
    preemptions: int = 0
    resumes: int = 0


@dataclasses.dataclass(slots=True)
class PendingFailures:
    """Failures of a Sync job waiting for attribution: the first failure
    opened the window; the others' exits and tails may still come in."""

    opened_at: float  # when the first failure was seen (engine time)
    deadline: float  # judge then at the latest
    failures: list  # attribution.Failure, in arrival order


@dataclasses.dataclass(slots=True)
class JobState:
    job_id: str
    framework: str
    settings: JobSettings
    pack: RulePack
    instances: dict  # name -> InstanceState, in rank order
    status: JobStatus = JobStatus.RUNNING
    round: int = 0  # job-level restarts so far; instance events carry it
    job_restarts: int = 0
    custom_keywords: list = dataclasses.field(default_factory=list)
    first_success_exit: Optional[float] = None
    sdk_seq: int = 0
    stale_events: int = 0
    final_reason: str = ""
    # Agents report each instance's silence every second; silence is not
    # judged on reports older than REPORT_STALE_S (missing data is not silence).
    activity_reports: bool = False
    silence_checks_skipped: int = 0
    # Collective timeouts (s) already advised about: one notification each.
    advised_timeouts: set = dataclasses.field(default_factory=set)
    spot: Optional[SpotState] = None
    pending_failures: Optional[PendingFailures] = None
    # engine/progress.py: the highest step the job reported (-1: it never
    # reports), that step when the round began, and the job restarts in a
    # row that made no progress.
    best_step: int = -1
    round_best_at_start: int = -1
    no_progress_restarts: int = 0
    # engine/operational.py: the job's latest failure (Sync jobs), and the
    # error signatures it has shown (bounded).
    last_failure: Optional[FailureMemory] = None
    signatures_seen: set = dataclasses.field(default_factory=set)
    # engine/messages.py: custom messages kept in the window that ends at
    # messages_window_end, and those dropped (not told yet; in all).
    messages_window_end: float = 0.0
    messages_in_window: int = 0
    messages_dropped: int = 0
    messages_dropped_total: int = 0

    @property
    def finished(self) -> bool:
        return self.status is not JobStatus.RUNNING

    def current(self, instance: str, round_: int, start: int) -> Optional[InstanceState]:
        """The instance if the event belongs to its current incarnation, else None."""
        inst = self.instances.get(instance)
        if inst is None or round_ != self.round or start != inst.start or self.finished:
            self.stale_events += 1
            return None
        return inst


def new_instance(spec: InstanceSpec, tail_lines: int) -> InstanceState:
    return InstanceState(spec=spec, tail=collections.deque(maxlen=tail_lines))


def new_job_state(job_id: str, framework: str, settings: JobSettings, pack: RulePack,
                  instances: tuple[InstanceSpec, ...]) -> JobState:
    return JobState(
        job_id=job_id,
        framework=framework,
        settings=settings,
        pack=pack,
        instances={spec.name: new_instance(spec, pack.tail_lines) for spec in instances},
    )
