"""Collectives that disagree: ranks waiting in different operations.

NCCL's watchdog prints the work each rank timed out on. When ranks time out
at the same sequence number in different operations (one in a BROADCAST,
another in an ALLREDUCE) or with different sizes, the program issued its
collectives in a different order on different ranks: a bug that repeats on
every restart, not a network stall.

A collective of one element that times out is a barrier (NCCL's
``dist.barrier`` is a one-element all-reduce) or a flag the program syncs:
one rank is doing something else (saving a checkpoint, evaluating, still
preparing its data, in a branch the others skip) for longer than the
timeout, and it does so again after a restart. A stalled link or a hung
GPU stops the large collectives of the training step just as well.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from trainwarden.evidence.ranks import strip_prefix

_WORK = re.compile(r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel>\d+))?")


def collective_desync(tail: Sequence[str]) -> Optional[str]:
    """The line that shows ranks disagreeing on a collective, or None."""
    seen: dict[str, tuple[str, str, str]] = {}
    for line in tail:
        match = _WORK.search(line)
        if match is None:
            continue
        seq, op, numel = match.group("seq"), match.group("op"), match.group("numel") or ""
        if seq in seen:
            first_op, first_numel, _ = seen[seq]
            if op != first_op or (numel and first_numel and numel != first_numel):
                return strip_prefix(line)
        else:
            seen[seq] = (op, numel, line)
    return None


_BARRIER = re.compile(r"store based barrier.*\(world_size=(?P<world>\d+), worker_count=(?P<workers>\d+)")


def store_barrier_overcount(tail: Sequence[str]) -> Optional[str]:
    """More workers reached the store barrier than the world has: a second
    launch (or a stale init file) joined the same store, which happens again."""
    for line in reversed(tail):
        match = _BARRIER.search(line)
        if match is not None and int(match.group("workers")) > int(match.group("world")):
            return strip_prefix(line)
    return None


_TIMED_OUT = re.compile(r"(?i)timeout|timed out|timing out")


def collective_timeout_one_element(tail: Sequence[str]) -> Optional[str]:
    """The watchdog's timeout line when every collective it says timed out
    carried one element (a barrier, a flag), or None."""
    found = None
    for line in tail:
        match = _WORK.search(line)
        if match is None or match.group("numel") is None or not _TIMED_OUT.search(line):
            continue
        if match.group("numel") != "1":
            return None
        found = found or strip_prefix(line)
    return found
