"""GPU memory held by someone else: an out-of-memory that is not the job's.

PyTorch's CUDA out-of-memory message says how big the GPU is, how much is
free, and how much this process holds (reserved by its allocator, or "this
process has N memory in use"). When the process holds little, asks for
little, and the GPU is still full, the memory belongs to another process: a
second tenant on a shared GPU, a crashed run that still holds the device.
The same job fits on a GPU of its own, so a restart elsewhere gets past it;
a job that itself needs more than the GPU has does not look like this.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

from trainwarden.evidence.ranks import strip_prefix

_UNITS = {"B": 1 / 2 ** 30, "KiB": 1 / 2 ** 20, "MiB": 1 / 2 ** 10, "GiB": 1.0, "TiB": 1024.0}
_SIZE = r"(?P<{}>\d+(?:\.\d+)?) ?(?P<{}_unit>KiB|MiB|GiB|TiB|B)\b"


def _size(name: str) -> str:
    return _SIZE.format(name, name)


_CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate " + _size("asked"))
_TOTAL = (re.compile(_size("total") + r" total capacity"), re.compile(r"total capacity of " + _size("total")))
_FREE = (re.compile(_size("free") + r" free\b"), re.compile(r"of which " + _size("free") + r" is free"))
_OWN = (re.compile(r"this process has " + _size("own") + r" memory in use"),
        re.compile(_size("own") + r" reserved in total by PyTorch"),
        re.compile(_size("own") + r" already allocated"))
# The others hold at least this share of the GPU, and this process (with
# what it asked for) at most this share.
HELD_ELSEWHERE = 0.5


@dataclasses.dataclass(frozen=True)
class CudaOom:
    asked: float  # GiB
    total: float
    free: float
    own: float

    @property
    def elsewhere(self) -> float:
        return max(0.0, self.total - self.free - self.own)


def _gib(match: re.Match, name: str) -> float:
    return float(match.group(name)) * _UNITS[match.group(name + "_unit")]


def _first(patterns, text: str, name: str) -> Optional[float]:
    for pattern in patterns:
        match = pattern.search(text)
        if match is not None:
            return _gib(match, name)
    return None


def parse_cuda_oom(line: str) -> Optional[CudaOom]:
    """The sizes a CUDA out-of-memory line tells, or None when it does not tell them all."""
    text = strip_prefix(line)
    asked = _CUDA_OOM.search(text)
    if asked is None:
        return None
    total, free, own = _first(_TOTAL, text, "total"), _first(_FREE, text, "free"), _first(_OWN, text, "own")
    if total is None or free is None or own is None or total <= 0:
        return None
    return CudaOom(_gib(asked, "asked"), total, free, own)


def cuda_memory_held_elsewhere(tail: Sequence[str]) -> Optional[str]:
    """The last CUDA out-of-memory line whose GPU is full of another process's memory, or None."""
    for line in reversed(tail):
        oom = parse_cuda_oom(line)
        if oom is None:
            continue
        if oom.elsewhere >= HELD_ELSEWHERE * oom.total and oom.own + oom.asked <= HELD_ELSEWHERE * oom.total:
            return line
        return None  # the last out-of-memory decides
    return None
