"""C4D diagnosis lines: the one place that reads them (format: docs/C4D.md).

C4D's real output format is not public, so Trainwarden defines a tolerant one:
a line that mentions C4D and carries ``key=value`` pairs (any order, any
case, values bare or double-quoted, separated by spaces or commas), or a JSON
object. Only ``level`` and ``kind`` are required.

    [C4D] 2026-11-29T12:00:05Z level=Error kind=RankCommHang rank=3 node=node-b detail="allreduce stuck 190 s"
    C4D: Level=warning, Kind=RankNonCommSlow, Rank=12, Node=gpu-017, Detail=compute 3.1x slower than peers
    {"c4d": true, "level": "Info", "kind": "RankCommSlow", "rank": 5, "node": "gpu-003", "detail": "..."}
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

KINDS = ("RankCommHang", "RankNonCommHang", "RankCommSlow", "RankNonCommSlow")
LEVELS = ("Info", "Warning", "Error")
_KIND_BY_LOWER = {k.lower(): k for k in KINDS}
_LEVEL_BY_LOWER = {lvl.lower(): lvl for lvl in LEVELS} | {"warn": "Warning", "err": "Error"}
_PAIR = re.compile(r'(\w+)\s*=\s*("((?:[^"\\]|\\.)*)"|[^\s,]+)')
_MARK = re.compile(r"\bC4D\b", re.IGNORECASE)
_DETAIL_REST = re.compile(r'\bdetail\s*=\s*(?!")(.+)$', re.IGNORECASE)
MAX_DETAIL = 2000


class C4DFormatError(ValueError):
    """A line that is meant for C4D (it says so) but cannot be read."""


@dataclasses.dataclass(frozen=True)
class Finding:
    level: str
    kind: str
    rank: int = -1
    node: str = ""
    job: str = ""
    detail: str = ""

    def rank_of_level(self) -> int:
        return LEVELS.index(self.level)


def level_rank(level: str) -> int:
    return LEVELS.index(level)


def looks_like_c4d(line: str) -> bool:
    return "c4d" in line.lower() and bool(_MARK.search(line))


def parse_line(line: str) -> Optional[Finding]:
    """The finding in this line; None if the line is not a C4D line at all.
    Raises C4DFormatError for a C4D line without a valid level and kind."""
    text = line.strip()
    if not text or not looks_like_c4d(text):
        return None
    if text.startswith("{"):
        try:
            fields = {str(k).lower(): v for k, v in json.loads(text).items()}
        except (ValueError, AttributeError):
            raise C4DFormatError("a C4D line that starts with '{' is not a JSON object") from None
    else:
        fields = {}
        for key, raw, quoted in _PAIR.findall(text):
            value = bytes(quoted, "utf-8").decode("unicode_escape") if raw.startswith('"') else raw.rstrip(":;,")
            fields[key.lower()] = value
        unquoted_detail = _DETAIL_REST.search(text)
        if unquoted_detail:
            # A bare detail runs to the end of the line: it is free text.
            fields["detail"] = unquoted_detail.group(1).strip()
        if "detail" not in fields:
            # Free text after the pairs (e.g. "...node=x: allreduce stuck") is the detail.
            tail = _PAIR.sub("", text.split("]", 1)[-1] if text.startswith("[") else text)
            tail = re.sub(r"\bC4D\b:?", "", tail, flags=re.IGNORECASE).strip(" :,-")
            if tail:
                fields["detail"] = tail
    level = _LEVEL_BY_LOWER.get(str(fields.get("level", "")).lower())
    kind = _KIND_BY_LOWER.get(str(fields.get("kind", "")).lower())
    if level is None or kind is None:
        raise C4DFormatError(f"a C4D line needs level ({'/'.join(LEVELS)}) and kind ({', '.join(KINDS)})")
    try:
        rank = int(fields.get("rank", -1))
    except (TypeError, ValueError):
        raise C4DFormatError(f"rank {fields.get('rank')!r} is not a number") from None
    return Finding(level=level, kind=kind, rank=rank, node=str(fields.get("node", ""))[:256],
                   job=str(fields.get("job", ""))[:128], detail=str(fields.get("detail", ""))[:MAX_DETAIL])
