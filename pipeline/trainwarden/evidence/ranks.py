"""Several ranks in one tail, and the launcher's own account of a failure.

One instance's tail can hold every rank's output: torchrun's ``[rankN]:``
prefixes (or the DeepSpeed launcher's ``[defaultN]:``, mpirun's
``[1,N]<stderr>:``, Ray's ``(Worker pid=N)``), interleaved. Split by rank,
each rank is judged like an instance of its own. torchrun ends with a
``ChildFailedError`` summary naming each failed rank's exit code; its "Root
Cause" is only the first exit torchrun saw, which may itself be aftermath.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

# "[rank3]:", "[default0]:", "[worker-1]" (our own echo), "[1,0]<stderr>:",
# "(RayWorkerWrapper pid=4009)". Not "[E ProcessGroupNCCL.cpp:563]" (a space)
# nor gloo's "[/path/pair.cc:561]" (a slash).
# mpirun's and horovodrun's form comes first: "[1]" alone would match the
# first alternative and leave "<stderr>:" on the line.
_PREFIX = re.compile(
    r"^(?:\s*(?:\[(?:\d+,)?\d+\]<std(?:out|err)>:|\[[\w.-]+\]:?|\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)))+\s*")
# torchrun "[rank3]:", DeepSpeed "[default3]:", mpirun --tag-output
# "[1,3]<stderr>:", horovodrun "[3]<stderr>:".
_RANK = re.compile(
    r"^\s*(?:\[(?:rank|default)(?P<a>\d+)\]:|\[(?:\d+,)?(?P<b>\d+)\]<std(?:out|err)>:)")

_SUMMARY_START = re.compile(r"ChildFailedError|^\s*Root Cause \(first observed failure\):")
_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s*(?P<key>rank|exitcode|traceback|host|error_file)\s*:\s*(?P<value>.*)$")
_RANK_VALUE = re.compile(r"^(-?\d+)")


# What a launcher prints about a failure whatever the failure was: the
# summary's fields, its frames and its own exception ("ChildFailedError",
# accelerate's "CalledProcessError ... returned non-zero exit status 1",
# torchelastic's "failed (exitcode: 1) local_rank: 0"). They say that a rank
# failed, never why.
_BOILERPLATE = re.compile(
    r"^(?:(?:time|host|rank|exitcode|error_file|traceback)\s*:|\[\d+\]:$|Failures:|Root Cause \(first observed"
    r"|<NO_OTHER_FAILURES>|[=-]{10,}$|\S+ FAILED$"
    r"|(?:torch\.distributed\.elastic\.multiprocessing\.errors\.)?ChildFailedError:?"
    r"|raise ChildFailedError\(|raise subprocess\.CalledProcessError\(|raise CalledProcessError\("
    r"|(?:subprocess\.)?CalledProcessError: Command .{0,2000} returned non-zero exit status"
    r"|(?:ERROR|WARNING|E\d{4} [\d:.]+ \d+ \S+\]|W\d{4} [\d:.]+ \d+ \S+\])"
    r"(?::torch\.distributed\.elastic\.multiprocessing\.api:|\s*)"
    r"(?:failed \(exitcode: -?\d+\) local_rank|Sending process \d+ closing signal))"
    r"|.{0,200}local_rank \S+ FAILED with no error file"
    r"|.{0,200}Pod: \S+ exited with code -?\d+")
_LAUNCHER_FRAME = re.compile(
    r"^File \".*/(?:torch/distributed/(?:run|launch|elastic/)|accelerate/commands/|deepspeed/launcher/)")


def launcher_boilerplate(line: str) -> bool:
    """A line a launcher prints about any failure (see _BOILERPLATE)."""
    text = strip_prefix(line)
    return _BOILERPLATE.match(text) is not None or _LAUNCHER_FRAME.match(text) is not None


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line).strip()


def rank_of(line: str) -> Optional[int]:
    match = _RANK.match(line)
    if match is None:
        return None
    return int(match.group("a") if match.group("a") is not None else match.group("b"))


def split_by_rank(tail: Sequence[str]) -> dict[Optional[int], list[str]]:
    """Lines per rank (prefix kept), in order; lines with no rank prefix under
    ``None``. A tail with fewer than two ranks comes back whole under ``None``."""
    groups: dict[Optional[int], list[str]] = {}
    for line in tail:
        groups.setdefault(rank_of(line), []).append(line)
    ranks = [key for key in groups if key is not None]
    if len(ranks) < 2:
        return {None: list(tail)}
    return groups


@dataclasses.dataclass(frozen=True)
class RankFailure:
    rank: int
    exit_code: Optional[int]
    traceback: str  # torchrun's "traceback :" field: a signal, an error file note


@dataclasses.dataclass(frozen=True)
class LauncherSummary:
    """torchrun's ChildFailedError summary."""

    root: Optional[RankFailure]  # "Root Cause (first observed failure)"
    others: tuple[RankFailure, ...]  # "Failures:"

    @property
    def every(self) -> tuple[RankFailure, ...]:
        return ((self.root,) if self.root else ()) + self.others


def launcher_summary(tail: Sequence[str]) -> Optional[LauncherSummary]:
    start = None
    for index, line in enumerate(tail):
        if _SUMMARY_START.search(strip_prefix(line)):
            start = index if start is None else start
    if start is None:
        return None
    root: Optional[RankFailure] = None
    others: list[RankFailure] = []
    section = "failures"
    current: dict[str, str] = {}

    def flush() -> None:
        nonlocal root
        if "rank" not in current:
            return
        rank = _RANK_VALUE.match(current["rank"])
        code = _RANK_VALUE.match(current.get("exitcode", ""))
        failure = RankFailure(int(rank.group(1)) if rank else -1, int(code.group(1)) if code else None,
                              current.get("traceback", ""))
        if section == "root" and root is None:
            root = failure
        else:
            others.append(failure)
        current.clear()

    for line in tail[start:]:
        text = strip_prefix(line)
        if text.startswith("Root Cause"):
            flush()
            section = "root"
            continue
        if text.startswith("Failures:"):
            flush()
            section = "failures"
            continue
        if _ENTRY.match(text) or text.startswith("=====") or text.startswith("-----"):
            flush()
            continue
        field = _FIELD.match(text)
        if field is not None:
            current[field.group("key")] = field.group("value").strip()
    flush()
    if root is None and not others:
        return None
    # "Failures:" also prints "<NO_OTHER_FAILURES>"; ranks listed twice count once.
    seen = {root.rank} if root else set()
    unique = []
    for failure in others:
        if failure.rank not in seen:
            seen.add(failure.rank)
            unique.append(failure)
    return LauncherSummary(root=root, others=tuple(unique))
