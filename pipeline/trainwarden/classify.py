"""The verdict on one failed instance: from its exit code and the tail of its log.

Pure. Facts are read from the tail once (the last Python traceback, the
signal that ended the process); then every catalogue classifier whose
conditions all hold is a candidate (its exit codes, signals, exception
types, the place the exception was raised, a pattern on a tail line). An
error of the instance's own beats aftermath (a peer closed the connection);
among equals the highest priority wins, ties go to the earlier rule. The
job's custom keywords (SDK ``set_retryable_errors``) are plain,
case-insensitive substrings that mark the failure retryable. No candidate
at all is the third verdict, unknown.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional, Sequence

from trainwarden.evidence.cxx import without_abort_echo
from trainwarden.evidence.facts import FACTS
from trainwarden.evidence.lexical import catalogue_context
from trainwarden.evidence.ranks import strip_prefix
from trainwarden.evidence.signals import canonical_exit_code, signal_death
from trainwarden.evidence.traceback import TRACEBACK_START, TracebackInfo, last_traceback, parse_exception
from trainwarden.rules.model import Classifier, Retryability, RulePack

__all__ = ["Candidate", "Verdict", "classify", "final_region", "last_exception_line", "normalise", "strip_prefix",
           "weigh_words"]

_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@%+~-]+){2,}/?"), "<path>"),
    (re.compile(r"\b\d+(?:\.\d+)*\b"), "<n>"),
)
MAX_SIGNATURE = 300
# Without a traceback, the final error region is this many last lines.
FINAL_REGION_LINES = 60


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One piece of evidence weighed: a classifier whose conditions held."""

    rule: str
    category: str
    verdict: Retryability
    priority: int
    line: str  # the tail line a pattern matched ("" for exit-code or structural evidence alone)
    aftermath: bool
    # "own": an error the instance reported itself (a pattern, a fact);
    # "structure": the exception's type and where it was raised;
    # "exit": the exit code or signal alone; "aftermath";
    # "lexical": what the words of the tail say (evidence.lexical).
    kind: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: Retryability
    category: str
    rule: str  # classifier name, "sdk:custom_keyword", or "fallback"
    matched_line: str  # the tail line that decided ("" when the exit code alone did)
    signature: str  # normalised error signature for same-error counting
    message: str  # the most telling line of the tail, for people
    priority: int = 0
    # Decided by aftermath only: the failure is a consequence of another's.
    aftermath: bool = False
    kind: str = "none"  # the winning candidate's kind: own, structure, exit, aftermath, keyword, lexical, none
    exit_code: int = 0  # canonical: a signal N as 128+N
    exception: str = ""  # the last traceback's exception type
    raised_in: str = ""  # where it was raised (evidence.traceback.Origin value)
    signal: int = 0
    evidence: tuple[Candidate, ...] = ()  # every candidate, the winner first

    @property
    def retryable(self) -> bool:
        return self.verdict is Retryability.RETRYABLE


def normalise(text: str) -> str:
    """Mask numbers, paths, addresses and ids so that the same error matches itself."""
    text = strip_prefix(text)
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text).strip()[:MAX_SIGNATURE]


def last_exception_line(tail: Sequence[str], strict: bool = False) -> str:
    """The last line that names an exception; unless strict, else the last non-empty line."""
    for line in reversed(tail):
        stripped = strip_prefix(line)
        if parse_exception(stripped) is not None and not stripped.endswith("Warning") and \
                "Warning:" not in stripped.split(" ", 1)[0]:
            return stripped
    if strict:
        return ""
    for line in reversed(tail):
        if line.strip():
            return strip_prefix(line)
    return ""


def final_region(tail: Sequence[str]) -> Sequence[str]:
    """Where the failure itself is told: from the last traceback to the end,
    or the last lines when there is none. A warning printed long before (a
    retried connection at start-up) must not outrank the error that ended it."""
    for index in range(len(tail) - 1, -1, -1):
        if TRACEBACK_START in tail[index]:
            return tail[index:]
    return tail[-FINAL_REGION_LINES:]


@dataclasses.dataclass(frozen=True)
class _Facts:
    exit_code: int
    signal: int
    traceback: Optional[TracebackInfo]
    exception_types: tuple[str, ...]  # the last exception and the causes chained before it
    named: dict  # fact name -> the line showing it (only facts that hold)


def _facts(pack: RulePack, exit_code: int, tail: Sequence[str]) -> _Facts:
    death = signal_death(exit_code, tail)
    info = last_traceback(tail)
    types: tuple[str, ...] = ()
    if info is not None and info.exception:
        types = (info.exception, *info.causes)
    else:
        line = last_exception_line(final_region(tail), strict=True)
        found = parse_exception(line) if line else None
        if found is not None:
            types = (found[0],)
    wanted = {name for classifier in pack.classifiers for name in classifier.facts}
    named = {}
    for name in wanted:
        line = FACTS[name](tail)
        if line is not None:
            named[name] = line
    return _Facts(canonical_exit_code(exit_code), death.signal if death else 0, info, types, named)


def _type_matches(wanted: tuple[str, ...], types: tuple[str, ...]) -> bool:
    for actual in types:
        short = actual.rsplit(".", 1)[-1]
        for name in wanted:
            if name == actual or name == short or actual.endswith("." + name):
                return True
    return False


def _structure_holds(classifier: Classifier, facts: _Facts) -> bool:
    if classifier.signals and facts.signal not in classifier.signals:
        return False
    if classifier.exceptions and not _type_matches(classifier.exceptions, facts.exception_types):
        return False
    if classifier.facts and not all(name in facts.named for name in classifier.facts):
        return False
    if classifier.raised_in:
        info = facts.traceback
        if info is None or info.raised_in is None or info.raised_in.value not in classifier.raised_in:
            return False
    return True


def _candidates(pack: RulePack, facts: _Facts, matched: dict[int, str]) -> list[tuple[Classifier, str, int]]:
    """The classifiers whose conditions hold; ``matched``: classifier index ->
    the line its patterns matched."""
    found = []
    for order, classifier in enumerate(pack.classifiers):
        if not classifier.matches_exit_code(facts.exit_code) or not _structure_holds(classifier, facts):
            continue
        line = facts.named[classifier.facts[0]] if classifier.facts else ""
        if classifier.patterns:
            if order not in matched:
                continue
            line = matched[order]
        found.append((classifier, line, order))
    return found


def _kind(classifier: Classifier) -> str:
    if classifier.aftermath:
        return "aftermath"
    if classifier.patterns or classifier.facts:
        return "own"
    if classifier.exceptions or classifier.raised_in:
        return "structure"
    return "exit"


# An error named by a pattern beats aftermath (a RuntimeError raised inside
# torch that says "Connection closed by peer" is aftermath, not a torch
# bug), which beats the exception's type and place alone, which beat the
# exit code alone.
_KIND_RANK = {"own": 3, "aftermath": 2, "structure": 1, "exit": 0}


def _rank(entry: tuple[Classifier, str, int]) -> tuple:
    classifier, _, order = entry
    return (_KIND_RANK[_kind(classifier)], classifier.priority, -order)


def classify(
    pack: RulePack,
    exit_code: int,
    tail: Sequence[str],
    custom_keywords: Iterable[str] = (),
) -> Verdict:
    tail = list(tail)[-pack.tail_lines:]
    facts = _facts(pack, exit_code, tail)
    # Patterns read what the process said: the abort() echo after an
    # uncaught C++ exception is how that exception ended it (evidence.cxx).
    said = without_abort_echo(tail)
    # One pass over the whole tail answers for the final region too (a suffix).
    everywhere = pack.pattern_index.last_match_positions(said) if pack.pattern_index is not None else {}
    region_start = len(said) - len(final_region(said))
    in_region = {order: line for order, (index, line) in everywhere.items()
                 if index >= region_start or pack.classifiers[order].anywhere}
    found = _candidates(pack, facts, in_region)
    if not any(_kind(c) in ("own", "aftermath") for c, _, _ in found):
        # Nothing said in the final region (a traceback cut short, a
        # launcher's summary): what the whole tail says.
        found = _candidates(pack, facts, {order: line for order, (_, line) in everywhere.items()})
    found.sort(key=_rank, reverse=True)
    evidence = tuple(Candidate(c.name, c.category, c.verdict, c.priority, strip_prefix(line) if line else "",
                               c.aftermath, _kind(c)) for c, line, _ in found)
    info = facts.traceback
    common = dict(exit_code=facts.exit_code, exception=facts.exception_types[0] if facts.exception_types else "",
                  raised_in=info.raised_in.value if info is not None and info.raised_in is not None else "",
                  signal=facts.signal, evidence=evidence)
    best = found[0] if found else None

    keyword_hit = _keyword_match(custom_keywords, tail)
    if keyword_hit is not None and (best is None or pack.custom_keyword_priority >= best[0].priority
                                    or best[0].aftermath):
        keyword, line = keyword_hit
        return Verdict(
            verdict=Retryability.RETRYABLE,
            category="custom_keyword",
            rule="sdk:custom_keyword",
            matched_line=strip_prefix(line),
            signature=f"sdk:custom_keyword:{keyword.lower()}",
            message=strip_prefix(line),
            priority=pack.custom_keyword_priority,
            kind="keyword",
            **common,
        )
    if best is None:
        exception = last_exception_line(tail, strict=True)
        return Verdict(
            verdict=pack.fallback_verdict,
            category=pack.fallback_category,
            rule="fallback",
            matched_line="",
            signature=normalise(exception) or "fallback",
            message=exception or last_exception_line(tail),
            **common,
        )
    classifier, line, _ = best
    structural_line = (f"{info.exception}: {info.message}".rstrip(": ")
                       if info is not None and info.exception and (classifier.exceptions or classifier.raised_in)
                       else "")
    evidence_line = strip_prefix(line) if line else structural_line or last_exception_line(tail, strict=True)
    message = strip_prefix(line) if line else structural_line or last_exception_line(tail)
    # A pattern names the error by itself; an exit-code or structural rule
    # says less, so the exception line tells same errors apart.
    if classifier.patterns and classifier.signature == "rule":
        signature = classifier.name
    else:
        signature = f"{classifier.name}:{normalise(evidence_line)}" if evidence_line else classifier.name
    return Verdict(
        verdict=classifier.verdict,
        category=classifier.category,
        rule=classifier.name,
        matched_line=strip_prefix(line) if line else "",
        signature=signature,
        message=message,
        priority=classifier.priority,
        aftermath=classifier.aftermath,
        kind=_kind(classifier),
        **common,
    )


def _keyword_match(keywords: Iterable[str], tail: Sequence[str]) -> Optional[tuple[str, str]]:
    lowered = [k.lower() for k in keywords if k]
    if not lowered:
        return None
    for line in reversed(tail):
        low = line.lower()
        for keyword in lowered:
            if keyword in low:
                return keyword, line
    return None


# The catalogue's weak evidence: nothing, or the exception's type and place
# alone. A pattern that names the error, the job's own keywords and
# aftermath are never outweighed by words, nor is a death by signal with
# nothing else said: the tail of a killed process holds whatever it was
# printing when the signal came, which does not say why it came (across the
# tuning set's repositories the words were right for fewer of them than
# the signal's own verdict).
_WEAK_KINDS = ("none", "structure")
LEXICAL_CATEGORIES = {Retryability.RETRYABLE: "likely_transient", Retryability.NOT_RETRYABLE: "likely_persistent"}


def weigh_words(pack: RulePack, verdict: Verdict, tail: Sequence[str]) -> Verdict:
    """The verdict once the words of the tail are weighed (``pack.lexical``).
    Where the catalogue's evidence is weak and the model is confident, the
    model decides; it is listed among the evidence either way. The
    signature stays the catalogue's, so that the same error still counts
    as the same."""
    model = pack.lexical
    if model is None or verdict.kind not in _WEAK_KINDS:
        return verdict
    # Where the failure is told (the last traceback on, or the last lines),
    # as for the patterns: an old warning must not outweigh the final error.
    score = model.score(final_region(list(tail)[-pack.tail_lines:]), context=catalogue_context(verdict.kind))
    said = Retryability.RETRYABLE if score.retryable >= 0.5 else Retryability.NOT_RETRYABLE
    words = ", ".join(f"{token} {weight:+.2f}" for token, weight in score.weighed)
    candidate = Candidate("lexical", LEXICAL_CATEGORIES[said], said, 0,
                          f"p(retryable)={score.retryable:.2f}: {words}", False, "lexical")
    if not model.confident(score):
        return dataclasses.replace(verdict, evidence=(*verdict.evidence, candidate))
    return dataclasses.replace(verdict, verdict=said, category=candidate.category, rule="lexical",
                               kind="lexical", evidence=(candidate, *verdict.evidence))
