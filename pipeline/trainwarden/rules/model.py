"""The parsed rule pack: frozen dataclasses, one per rule kind.

A rule pack has four sections, each a flat list of named rules:

- ``classifiers``: the retryable / non-retryable catalogue (exit codes and
  log-tail patterns) that judges a failed instance;
- ``responses``: first match wins; what to do about a failed instance given
  the policy, the execution mode, the role and the verdict;
- ``detectors``: timers over the job's output (hang, exit hang);
- ``limits``: guards in front of restarts (switches, counters, ratios); the
  first one that holds turns the restart into ``fail_job``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from trainwarden.events import DecisionKind, ErrorSource, Reason
from trainwarden.evidence.lexical import LexicalModel


@dataclasses.dataclass(frozen=True)
class Origin:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class Retryability(str, enum.Enum):
    """The three verdicts on a failure."""

    RETRYABLE = "retryable"
    NOT_RETRYABLE = "not_retryable"
    UNKNOWN = "unknown"  # no evidence either way: the rule pack's unknown policy applies


@dataclasses.dataclass(frozen=True)
class Classifier:
    """One entry of the catalogue. Every condition given must hold (each is
    "any of" its list); a classifier needs at least one condition."""

    name: str
    category: str
    verdict: Retryability
    exit_codes: tuple[tuple[int, int], ...]  # inclusive ranges; empty = any
    patterns: tuple  # RE2 patterns (rules/patterns.py): any of them on a tail line; empty = no log condition
    priority: int
    description: str
    origin: Origin
    # "rule": every match is the same error; "line": the matched line,
    # normalised, tells errors apart (for broad classes such as any ValueError).
    signature: str = "rule"
    # Structural conditions (trainwarden/evidence): the last traceback's
    # exception type or a cause chained before it, where it was raised, the
    # signal that ended the process (either spelling of the exit code or the text).
    exceptions: tuple[str, ...] = ()
    raised_in: tuple[str, ...] = ()
    signals: tuple[int, ...] = ()
    # Named facts that need more than one line (trainwarden/evidence), e.g.
    # collective_desync: ranks timed out in different collectives.
    facts: tuple[str, ...] = ()
    # A line that one of these also matches does not count for this classifier.
    unless: tuple = ()
    # A consequence of another instance's failure (a peer closed the
    # connection, a collective aborted): never the root cause while another
    # instance has an error of its own.
    aftermath: bool = False
    # A line that names a cause ahead of its effect (gloo's warning that it
    # falls back to the loopback address, printed before the connect that
    # fails): it counts wherever in the tail it is, not only where the
    # failure itself is told.
    anywhere: bool = False

    @property
    def retryable(self) -> bool:
        return self.verdict is Retryability.RETRYABLE

    @property
    def structural(self) -> bool:
        return bool(self.exceptions or self.raised_in or self.signals or self.facts)

    def matches_exit_code(self, code: int) -> bool:
        return not self.exit_codes or any(low <= code <= high for low, high in self.exit_codes)


@dataclasses.dataclass(frozen=True)
class ResponseMatch:
    policies: tuple[str, ...] = ()  # empty = any
    modes: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    retryable: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class Response:
    name: str
    when: ResponseMatch
    action: DecisionKind  # restart_job, restart_instance or fail_job
    reason: Reason
    origin: Origin


class DetectorKind(str, enum.Enum):
    SILENCE = "silence"  # every running instance silent for the interval
    EXIT_HANG = "exit_hang"  # job not finished within the interval after a successful exit


@dataclasses.dataclass(frozen=True)
class Detector:
    name: str
    kind: DetectorKind
    enabled_by: str  # a boolean flag
    modes: tuple[str, ...]
    interval_flag: str
    error_source: ErrorSource
    action: DecisionKind
    reason: Reason
    origin: Origin
    # Silence: until an instance's first output line (or SDK call), it gets
    # at least this long (slow imports, process-group set-up); 0 = none.
    startup_allowance_s: int = 0


class LimitKind(str, enum.Enum):
    FLAG_REQUIRED = "flag_required"  # holds when the boolean flag is False
    MAX_COUNT = "max_count"  # holds when counter (including this fault) > flag value
    MAX_RATIO = "max_ratio"  # holds when ratio > flag value (flag -1 = off)


class Counter(str, enum.Enum):
    JOB_RESTARTS = "job_restarts"  # job restarts including the one asked for
    INSTANCE_RESTARTS = "instance_restarts"  # restarts of the failed instance, including this one
    SAME_ERROR = "same_error"  # occurrences of this error on this instance, including this one
    FAILED_INSTANCE_RATIO = "failed_instance_ratio"  # distinct failed instances of `roles` / their count
    # restarts in a row that made no progress, including this one (engine/progress.py)
    NO_PROGRESS_RESTARTS = "no_progress_restarts"


@dataclasses.dataclass(frozen=True)
class Limit:
    name: str
    kind: LimitKind
    applies_to: tuple[DecisionKind, ...]
    flag: str
    counter: Optional[Counter]
    roles: tuple[str, ...]
    reason: Reason
    origin: Origin


@dataclasses.dataclass(frozen=True)
class DiagnosisRule:
    """What to do about a diagnostic agent's finding (C4D), first match wins."""

    name: str
    source: str  # "c4d"
    levels: tuple[str, ...]  # Error, Warning, Info; empty = any
    kinds: tuple[str, ...]  # RankCommHang, ...; empty = any
    enabled_by: tuple[str, ...]  # True/False flags that must all be True
    isolate_node: bool  # isolate the reported node first
    action: Optional[DecisionKind]  # restart_job, notify, or None (record only)
    reason: Reason
    origin: Origin


@dataclasses.dataclass(frozen=True)
class OperationalSettings:
    """``settings.decisions`` of the rule pack: how what the job did before
    it failed weighs beside its lines (engine/operational.py).

    - ``repeat_restarts``: restarts of the same failure while the job gets
      no further (before any progress in its round, or again at the step it
      failed at); the next such failure fails the job. -1: off.
    - ``second_chance``: a job that made progress and then fails with a
      not-retryable error it never showed before, on weak evidence, gets one
      restart from its checkpoint.
    - ``sure_categories``: the not-retryable categories whose evidence is
      strong (the error follows from the job's own code, data or memory
      wherever and whenever it runs); every other not-retryable verdict is
      weak, unless its rule is one of ``sure_rules``.
    - ``sure_rules``: classifiers whose not-retryable verdict is strong
      evidence whatever its category: they name a message that only a wrong
      program, arguments or configuration prints (a framework's own
      configuration check, autograd misuse, a device-side assert, NCCL's
      invalid usage), never words a platform fault also prints. Their first
      error gets no restart, before or after progress.
    - ``start_categories``: the not-retryable categories whose first error
      before any progress in its round gets one restart (with
      ``second_chance``): at start-up a restart costs no training work, and
      a platform that is not ready yet (no nodes placed, a driver not
      loaded, a rendezvous closed before late workers came) prints errors
      that look like the job's configuration.
    - ``node_repeats``: the same retryable error on the same node this many
      times in a row isolates the node (-1: off), for a verdict of one of
      ``node_categories`` (failures a machine causes)."""

    repeat_restarts: int = 1
    second_chance: bool = True
    sure_categories: tuple[str, ...] = ("cuda_oom", "user_shape_error", "user_missing_module", "numerical",
                                        "storage_full")
    sure_rules: tuple[str, ...] = ()
    start_categories: tuple[str, ...] = ("config_error",)
    node_repeats: int = 2
    node_categories: tuple[str, ...] = ("gpu_hardware", "host_oom", "connection_lost", "collective_error",
                                        "infra_transient")


@dataclasses.dataclass(frozen=True)
class RulePack:
    classifiers: tuple[Classifier, ...]
    fallback_verdict: Retryability
    fallback_category: str
    responses: tuple[Response, ...]
    detectors: tuple[Detector, ...]
    limits: tuple[Limit, ...]
    tail_lines: int
    custom_keyword_priority: int
    files: tuple[str, ...]
    diagnoses: tuple[DiagnosisRule, ...] = ()
    # Unknown verdicts: how often the same unknown error on one instance is
    # treated as retryable before it fails the job (shipped: once).
    unknown_restarts: int = 1
    # Sync jobs: after the first failure, how long to wait for the other
    # instances' exits and tails before judging the job's root cause.
    attribution_window_s: float = 5.0
    # How long a death by an outside SIGTERM waits for the
    # scheduler's word that it preempted the job (engine/preemption.py)
    # before it is judged as a failure.
    platform_notice_window_s: float = 5.0
    # A job that never reports its progress (SDK report_progress) made
    # progress in a round that ran this long (engine/progress.py).
    progress_min_run_s: float = 1800.0
    # Custom messages (SDK) of one job that become a history row and a
    # notification each, per window; the rest are dropped and counted
    # (engine/messages.py).
    custom_messages_per_window: int = 30
    custom_messages_window_s: float = 60.0
    # What the job did before it failed (engine/operational.py).
    decisions: OperationalSettings = OperationalSettings()
    # What the words of a tail say, learned from real failures
    # (evidence/lexical.py); weighed where the catalogue has only weak
    # evidence. None: the catalogue alone.
    lexical: Optional["LexicalModel"] = dataclasses.field(default=None, compare=False, repr=False)
    # Every classifier's patterns in one RE2 set (rules/patterns.py), built by the loader.
    pattern_index: Optional[object] = dataclasses.field(default=None, compare=False, repr=False)

    def __deepcopy__(self, memo: dict) -> "RulePack":
        # Immutable, and holds compiled RE2 objects that cannot be copied:
        # a snapshot of a job's state shares its rule pack.
        return self

    def detector(self, kind: DetectorKind) -> tuple[Detector, ...]:
        return tuple(d for d in self.detectors if d.kind is kind)
