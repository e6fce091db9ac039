"""A job failure's root cause, across instances and across the ranks of one tail.

Pure. When coupled instances fail together, the first one to exit is often
not the one that failed: a rank that raised an error of its own may take
seconds in its exit handlers while its peers, whose connections it closed,
exit at once with "Connection closed by peer". Each failure (and each rank
of a tail that holds several) is classified on its own; an own error beats
aftermath and a bare exit code, the earlier beats the later; torchrun's
summary says which ranks its agent killed (-15/-9 after a first failure).
The root cause decides; the others are recorded as its consequences.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Optional, Sequence

from trainwarden.classify import Verdict, classify, weigh_words
from trainwarden.evidence.ranks import launcher_summary, split_by_rank, strip_prefix
from trainwarden.evidence.signals import signal_death
from trainwarden.rules.model import Retryability, RulePack

# The launcher's SIGTERM and SIGKILL to the other ranks after a first failure.
_LAUNCHER_SIGNALS = (9, 15)


class RootReason(str, enum.Enum):
    """Why the root cause was chosen (shown by ``classify --explain``)."""

    ONLY_FAILURE = "only_failure"
    FIRST_OWN_ERROR = "first_own_error"  # the earliest failure with an error of its own
    LAUNCHER_ROOT_CAUSE = "launcher_root_cause"  # own error of the rank torchrun saw fail first
    NO_OWN_ERROR = "no_own_error"  # only exit codes: the earliest
    ONLY_AFTERMATH = "only_aftermath"  # every failure is a consequence; the earliest decides


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed instance as the engine saw it: its exit and its tail."""

    instance: str
    exit_code: int
    tail: tuple[str, ...]
    time: float = 0.0  # when it exited; earlier first


@dataclasses.dataclass(frozen=True)
class Judged:
    instance: str
    rank: Optional[int]  # the rank within the instance's tail, when it held several
    exit_code: int
    time: float
    position: int  # tie-break within one tail: where its deciding line is
    verdict: Verdict
    consequence: bool  # aftermath, or the launcher's kill of a rank after another's failure
    lines: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)  # what it was judged on

    @property
    def label(self) -> str:
        return self.instance if self.rank is None else f"{self.instance} rank {self.rank}"

    @property
    def own_error(self) -> bool:
        return not self.consequence and self.verdict.kind in ("own", "structure", "keyword")


@dataclasses.dataclass(frozen=True)
class Judgement:
    root: Judged
    consequences: tuple[Judged, ...]
    reason: RootReason

    @property
    def verdict(self) -> Verdict:
        return self.root.verdict


def judge(pack: RulePack, failures: Sequence[Failure], custom_keywords: Iterable[str] = ()) -> Judgement:
    """The root cause of these failures (at least one), and its consequences."""
    if not failures:
        raise ValueError("judge needs at least one failure")
    keywords = tuple(custom_keywords)
    judged: list[Judged] = []
    for failure in failures:
        judged.extend(_judge_instance(pack, failure, keywords))
    judged = _mark_launcher_kills(judged)
    ordered = sorted(judged, key=lambda j: (j.time, j.position))
    root, reason = _choose(ordered)
    rest = tuple(j for j in ordered if j is not root)
    # The root is chosen on the catalogue's evidence alone; only then are its
    # words weighed, so that a rank with nothing telling never becomes the
    # root through them.
    root = dataclasses.replace(root, verdict=weigh_words(pack, root.verdict, root.lines))
    return Judgement(root=root, consequences=rest, reason=reason)


def _judge_instance(pack: RulePack, failure: Failure, keywords: tuple[str, ...]) -> list[Judged]:
    tail = list(failure.tail)[-pack.tail_lines:]
    groups = split_by_rank(tail)
    whole = classify(pack, failure.exit_code, tail, keywords)
    if set(groups) == {None} or whole.rule in _cross_rank_rules(pack):
        # Evidence across ranks (collectives that disagree) is seen only in the whole tail.
        return [Judged(failure.instance, None, failure.exit_code, failure.time, 0, whole, whole.aftermath,
                       tuple(tail))]
    summary = launcher_summary(tail)
    codes = {f.rank: f.exit_code for f in summary.every} if summary else {}
    positions = {line: index for index, line in enumerate(tail)}
    judged = []
    for rank, lines in groups.items():
        if rank is None:
            continue
        code = codes.get(rank)
        if code is None:
            # The instance's exit code is the launcher's, one for every rank;
            # a rank whose own lines say how it died ("Killed") died so.
            death = signal_death(0, lines)
            code = 128 + death.signal if death is not None else None
        verdict = classify(pack, failure.exit_code if code is None else code, lines, keywords)
        if verdict.kind in ("exit", "none") and code is None and summary is not None:
            continue  # a rank that printed nothing telling and that the launcher does not list did not fail
        position = _position(verdict, lines, positions)
        judged.append(Judged(failure.instance, rank, failure.exit_code if code is None else code, failure.time,
                             position, verdict, verdict.aftermath, tuple(lines)))
    launcher_lines = groups.get(None, [])
    if launcher_lines or not judged:
        verdict = classify(pack, failure.exit_code, launcher_lines or tail, keywords)
        root_rank = summary.root.rank if summary and summary.root else None
        if not judged or verdict.kind != "none":
            judged.append(Judged(failure.instance, None, failure.exit_code, failure.time,
                                 _position(verdict, launcher_lines, positions), verdict, verdict.aftermath,
                                 tuple(launcher_lines or tail)))
        if root_rank is not None:
            judged = [_prefer_summary_root(j, root_rank) for j in judged]
    return judged


def _cross_rank_rules(pack: RulePack) -> frozenset[str]:
    return frozenset(c.name for c in pack.classifiers if c.facts)


def _position(verdict: Verdict, lines: Sequence[str], positions: dict) -> int:
    if verdict.matched_line:
        for line in lines:
            if strip_prefix(line) == verdict.matched_line:
                return positions.get(line, 0)
    return positions.get(lines[-1], 0) if lines else 0


def _prefer_summary_root(judged: Judged, root_rank: int) -> Judged:
    # torchrun observed this rank fail first: among own errors it goes first.
    if judged.rank == root_rank and judged.own_error:
        return dataclasses.replace(judged, position=-1)
    return judged


def _mark_launcher_kills(judged: list[Judged]) -> list[Judged]:
    """A rank ended by SIGTERM/SIGKILL with nothing of its own to say, next to
    a failure that has: the launcher stopping the survivors."""
    if not any(j.own_error for j in judged):
        return judged
    marked = []
    for j in judged:
        killed = j.verdict.signal in _LAUNCHER_SIGNALS and j.verdict.kind in ("exit", "none")
        marked.append(dataclasses.replace(j, consequence=True) if killed and not j.consequence else j)
    return marked


def _choose(ordered: list[Judged]) -> tuple[Judged, RootReason]:
    if len(ordered) == 1:
        return ordered[0], RootReason.ONLY_FAILURE
    own = [j for j in ordered if j.own_error]
    decided = [j for j in own if j.verdict.verdict is not Retryability.UNKNOWN] or own
    if decided:
        first = min(decided, key=lambda j: (j.time, j.position))
        reason = RootReason.LAUNCHER_ROOT_CAUSE if first.position == -1 else RootReason.FIRST_OWN_ERROR
        return first, reason
    bare = [j for j in ordered if not j.consequence]
    if bare:
        return bare[0], RootReason.NO_OWN_ERROR
    return ordered[0], RootReason.ONLY_AFTERMATH

