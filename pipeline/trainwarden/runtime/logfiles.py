"""Instance output files that stop growing: each one rotates at a size.

One implementation for the node agent's files (which Vector ships) and for
``trainwarden run --log-dir``. A file that would pass ``max_bytes`` with the
next line is renamed ``NAME.1`` (older ones move to ``NAME.2`` ...
``NAME.<keep>``, and the oldest is deleted), then a new ``NAME`` is opened.
An incarnation's stream thus holds at most ``(keep + 1) * max_bytes`` on
disk, whatever the job prints.

Why rename, and why a rotated file is kept a while (``MIN_ROTATED_AGE_S``):
Vector's file source follows a file by device and inode and reads a renamed
one to its end through the handle it holds; the rotated names do not end in
``.log``, so its ``**/*.log`` glob never takes them for new files. Vector
keeps the read position of a file it stopped following for 60 s; a file
deleted sooner than that may hand its inode to the next new ``NAME``, which
Vector would then take for the old file and read from the old position on.
So a rotated file is deleted only once it has been rotated out for
``MIN_ROTATED_AGE_S``; a job that fills every file faster than that has its
further lines left out of the file (counted) until the oldest may go. The
agent still ships and tails those lines: only the file misses them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable, Optional

MIB = 1024 * 1024
DEFAULT_MAX_MB = 64
DEFAULT_KEEP = 2
MAX_KEEP = 100
MAX_MB = 1024 * 1024  # 1 TiB: any larger figure is a typo
# Longer than Vector's 60 s expiry of a followed file's read position, plus
# its file discovery period: see the module docstring.
MIN_ROTATED_AGE_S = 90.0
# While lines are left out, how often the oldest file's age is looked at again.
RETRY_S = 1.0


@dataclasses.dataclass(frozen=True)
class LogFileLimits:
    """Per file: ``max_bytes``; rotated files kept per stream: ``keep``."""

    max_bytes: int = DEFAULT_MAX_MB * MIB
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        if self.max_bytes < MIB:
            raise ValueError(f"a log file may hold at least 1 MiB, not {self.max_bytes} bytes")
        if not 1 <= self.keep <= MAX_KEEP:
            raise ValueError(f"rotated log files kept must be from 1 to {MAX_KEEP}, not {self.keep}")


def limits_from_flags(max_mb: int, keep: int) -> tuple[Optional[LogFileLimits], str]:
    """The limits of ``--log-file-max-mb`` and ``--log-files-kept``, or (None,
    one sentence naming the flag)."""
    if not 1 <= max_mb <= MAX_MB:
        return None, f"--log-file-max-mb must be from 1 to {MAX_MB} (MiB per instance output file), not {max_mb}"
    if not 1 <= keep <= MAX_KEEP:
        return None, (f"--log-files-kept must be from 1 to {MAX_KEEP} (rotated files kept per output file; Vector "
                      f"reads a rotated file to its end before it may go), not {keep}")
    return LogFileLimits(max_mb * MIB, keep), ""


@dataclasses.dataclass
class LogFileCounters:
    """What the files did; the agent's counters have the same two fields."""

    log_rotations: int = 0
    log_lines_unwritten: int = 0  # left out of a full file while its oldest rotated file was too young to go


def rotated(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


class RotatingLogFile:
    """One output file: ``write_line``, ``flush``, ``close``. OSError reaches
    the caller (a full disk), as with a plain file."""

    def __init__(self, path: Path, limits: LogFileLimits, counters, wall: Callable[[], float] = time.time):
        self.path = Path(path)
        self.limits = limits
        self.counters = counters  # has log_rotations and log_lines_unwritten
        self.wall = wall  # compared with file times of this host's kernel only
        try:
            self._handle = open(self.path, "ab")
        except FileNotFoundError:
            # Made only when missing: each incarnation opens its files in the
            # instance's directory, there after the first (a mkdir that finds
            # it costs an exception: 8% of an agent's CPU in a 1,024-wide restart).
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "ab")
        self.size = os.fstat(self._handle.fileno()).st_size
        self._full_until = 0.0  # while lines are left out: when to look at the oldest file again

    def write_line(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", errors="replace")
        if self.size and self.size + len(data) > self.limits.max_bytes and not self._rotate():
            self.counters.log_lines_unwritten += 1
            return
        self._handle.write(data)
        self.size += len(data)

    def _rotate(self) -> bool:
        """Make room: True once a new, empty file is open."""
        now = self.wall()
        if now < self._full_until:
            return False
        oldest = rotated(self.path, self.limits.keep)
        try:
            rotated_at = oldest.stat().st_mtime  # its last write: when it was rotated out
        except FileNotFoundError:
            rotated_at = None
        if rotated_at is not None and now - rotated_at < MIN_ROTATED_AGE_S:
            self._full_until = now + RETRY_S
            return False
        self._handle.close()
        try:
            if rotated_at is not None:
                oldest.unlink(missing_ok=True)
            for index in range(self.limits.keep - 1, 0, -1):
                try:
                    os.replace(rotated(self.path, index), rotated(self.path, index + 1))
                except FileNotFoundError:
                    pass
            os.replace(self.path, rotated(self.path, 1))
        finally:
            # Whatever failed, the file stays usable (a rename refused: the old one again).
            self._handle = open(self.path, "ab")
            self.size = os.fstat(self._handle.fileno()).st_size
        self.counters.log_rotations += 1
        return True

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def log_file(directory: Path, job_id: str, instance: str, round_: int, start: int, stream: str) -> Path:
    """Where an incarnation's output goes, on a node agent and with ``run
    --log-dir`` alike: the same Vector configuration and habits serve both."""
    return directory / job_id / instance / f"r{round_}-s{start}.{stream}.log"


class InstanceFiles:
    """Every incarnation's output lines appended to its files, one per
    stream, each rotating at ``limits``. A failed write raises OSError (a
    full disk): what then is the caller's policy."""

    def __init__(self, directory: Path, limits: LogFileLimits, counters):
        self.directory = Path(directory)
        self.limits = limits
        self.counters = counters  # has log_rotations and log_lines_unwritten
        self._files: dict[tuple[str, str, int, int, str], RotatingLogFile] = {}

    def write(self, line) -> None:
        """One LogLine (events.py), to its incarnation's file."""
        key = (line.job_id, line.instance, line.round, line.start, line.stream.value)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = RotatingLogFile(log_file(self.directory, *key), self.limits, self.counters)
        handle.write_line(line.text)

    def flush(self) -> None:
        """A failure is the next write's to report."""
        for handle in self._files.values():
            try:
                handle.flush()
            except OSError:
                pass

    def close_incarnation(self, job_id: Optional[str], instance: str, round_: int, start: int) -> None:
        """Its pipes are drained before its exit is reported: nothing more
        comes. ``job_id`` None: of whichever job (``run`` has one)."""
        for key in [k for k in self._files if k[1:4] == (instance, round_, start) and job_id in (None, k[0])]:
            self._close(key)

    def close(self) -> None:
        for key in list(self._files):
            self._close(key)

    def _close(self, key) -> None:
        handle = self._files.pop(key)
        try:
            handle.close()
        except OSError:
            pass
