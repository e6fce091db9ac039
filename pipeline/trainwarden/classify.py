"""The verdict on a failed instance: from its exit code and the tail of its log.

Pure: the rule pack's classifiers are tried against the exit code and the
bounded tail; the highest priority match wins (ties: the earlier rule). The
job's custom keywords (SDK ``set_retryable_errors``) are plain,
case-insensitive substrings that mark the failure retryable.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

from trainwarden.rules.model import Classifier, RulePack

# Output of several ranks interleaves with prefixes such as "[rank3]:" or
# "[default0]:"; they are not part of the error.
_RANK_PREFIX = re.compile(r"^(?:\[[\w.-]+\]:?\s*)+")
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning|Fault)\b(?::|$)"
)
_MASKS = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@%+~-]+){2,}/?"), "<path>"),
    (re.compile(r"\b\d+(?:\.\d+)*\b"), "<n>"),
)
MAX_SIGNATURE = 300
# Without a traceback, the final error region is this many last lines.
FINAL_REGION_LINES = 60
_TRACEBACK_START = "Traceback (most recent call last)"


@dataclasses.dataclass(frozen=True)
class Verdict:
    retryable: bool
    category: str
    rule: str  # classifier name, "sdk:custom_keyword", or "fallback"
    matched_line: str  # the tail line that decided ("" when the exit code alone did)
    signature: str  # normalised error signature for same-error counting
    message: str  # the most telling line of the tail, for people
    priority: int = 0


def strip_prefix(line: str) -> str:
    return _RANK_PREFIX.sub("", line).strip()


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
        if _EXCEPTION_LINE.match(stripped):
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
        if _TRACEBACK_START in tail[index]:
            return tail[index:]
    return tail[-FINAL_REGION_LINES:]


def _first_match(classifier: Classifier, tail: Sequence[str]) -> str | None:
    # Later lines are nearer the failure, so search from the end.
    for line in reversed(tail):
        for pattern in classifier.patterns:
            if pattern.search(line):
                return line
    return None


def classify(
    pack: RulePack,
    exit_code: int,
    tail: Sequence[str],
    custom_keywords: Iterable[str] = (),
) -> Verdict:
    tail = list(tail)[-pack.tail_lines:]
    best = _best(pack, exit_code, final_region(tail), need_pattern=True) or _best(pack, exit_code, tail)

    keyword_hit = _keyword_match(custom_keywords, tail)
    if keyword_hit is not None and (best is None or pack.custom_keyword_priority >= best[0]):
        keyword, line = keyword_hit
        return Verdict(
            retryable=True,
            category="custom_keyword",
            rule="sdk:custom_keyword",
            matched_line=strip_prefix(line),
            signature=f"sdk:custom_keyword:{keyword.lower()}",
            message=strip_prefix(line),
            priority=pack.custom_keyword_priority,
        )
    if best is None:
        exception = last_exception_line(tail, strict=True)
        return Verdict(
            retryable=pack.fallback_retryable,
            category=pack.fallback_category,
            rule="fallback",
            matched_line="",
            signature=normalise(exception) or "fallback",
            message=exception or last_exception_line(tail),
        )
    priority, _, classifier, line = best
    message = strip_prefix(line) if line else last_exception_line(tail)
    # A pattern names the error by itself; an exit-code rule says little, so
    # the last exception line (if there is one: a progress line is not an
    # error) tells same errors apart.
    if classifier.patterns and classifier.signature == "rule":
        signature = classifier.name
    else:
        evidence = strip_prefix(line) if line else last_exception_line(tail, strict=True)
        signature = f"{classifier.name}:{normalise(evidence)}" if evidence else classifier.name
    return Verdict(
        retryable=classifier.retryable,
        category=classifier.category,
        rule=classifier.name,
        matched_line=strip_prefix(line) if line else "",
        signature=signature,
        message=message,
        priority=priority,
    )


def _best(pack: RulePack, exit_code: int, lines: Sequence[str],
          need_pattern: bool = False) -> tuple[int, int, Classifier, str] | None:
    """The winning classifier over these lines: (priority, -order, classifier, matched line).
    With need_pattern, None unless some pattern matched in these lines."""
    best: tuple[int, int, Classifier, str] | None = None
    pattern_matched = False
    for order, classifier in enumerate(pack.classifiers):
        if not classifier.matches_exit_code(exit_code):
            continue
        line = ""
        if classifier.patterns:
            found = _first_match(classifier, lines)
            if found is None:
                continue
            line, pattern_matched = found, True
        if best is None or (classifier.priority, -order) > (best[0], best[1]):
            best = (classifier.priority, -order, classifier, line)
    if need_pattern and not pattern_matched:
        return None
    return best


def _keyword_match(keywords: Iterable[str], tail: Sequence[str]) -> tuple[str, str] | None:
    lowered = [k.lower() for k in keywords if k]
    if not lowered:
        return None
    for line in reversed(tail):
        low = line.lower()
        for keyword in lowered:
            if keyword in low:
                return keyword, line
    return None
