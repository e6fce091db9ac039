"""Catalogue patterns, in linear time: RE2, all of a pack's patterns in one set.

A rule pattern runs on lines a job prints, so it must not be able to stall
classification: RE2 (google-re2) matches in time linear in the line, and a
pattern it cannot run that way (backreferences, lookaround) is refused when
the rules load. One ``re2.Set`` holds every classifier's patterns, so each
tail line is scanned once for the whole catalogue.
"""

from __future__ import annotations

from typing import Sequence

import re2

# Enough DFA memory for a few hundred patterns on 16 KiB lines; RE2 falls back
# to its (still linear) NFA beyond it.
MAX_MEM = 256 << 20


def _options() -> "re2.Options":
    options = re2.Options()
    options.log_errors = False
    options.max_mem = MAX_MEM
    return options


class PatternError(ValueError):
    pass


def compile_pattern(pattern: str, ignore_case: bool = False) -> "re2._Regexp":
    text = f"(?i){pattern}" if ignore_case else pattern
    try:
        return re2.compile(text, _options())
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(f"{detail} (patterns are RE2: no backreferences or lookaround)") from None


class PatternIndex:
    """Which classifiers' patterns match which tail lines, one pass per line.

    Built once per rule pack. ``unless`` patterns exclude a line from their
    classifier (a line that says a peer is gone is not an error of its own)."""

    def __init__(self, classifiers: Sequence) -> None:
        self._owners: list[tuple[int, bool]] = []
        self._set = re2.Set.SearchSet(_options())
        for index, classifier in enumerate(classifiers):
            for pattern in classifier.patterns:
                self._add(pattern.pattern, index, False)
            for pattern in classifier.unless:
                self._add(pattern.pattern, index, True)
        self._empty = not self._owners
        if not self._empty:
            self._set.Compile()

    def _add(self, text: str, owner: int, unless: bool) -> None:
        if self._set.Add(text) < 0:
            raise PatternError(f"RE2 refused the pattern {text!r}")
        self._owners.append((owner, unless))

    def last_matches(self, lines: Sequence[str]) -> dict[int, str]:
        """Classifier index -> the line nearest the end that one of its
        patterns matches (and none of its ``unless`` patterns)."""
        return {owner: line for owner, (_, line) in self.last_match_positions(lines).items()}

    def last_match_positions(self, lines: Sequence[str]) -> dict[int, tuple[int, str]]:
        """Classifier index -> (index, line) of the line nearest the end that
        one of its patterns matches. Read on a whole tail, it also answers for
        any suffix of it: a classifier matches in the last K lines exactly
        when its last match is among them."""
        found: dict[int, tuple[int, str]] = {}
        if self._empty:
            return found
        owners = self._owners
        for index in range(len(lines) - 1, -1, -1):
            line = lines[index]
            hits = self._set.Match(line)
            if not hits:
                continue
            excluded = {owners[i][0] for i in hits if owners[i][1]}
            for i in hits:
                owner, unless = owners[i]
                if not unless and owner not in excluded and owner not in found:
                    found[owner] = (index, line)
        return found
