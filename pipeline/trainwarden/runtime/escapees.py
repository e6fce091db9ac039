"""The escaped descendants of an incarnation: processes that left its process
group (setsid, daemons) but still carry its mark, ``MARK_VARIABLE=<mark>``,
in their environment (runtime/keeper.py), found over /proc and SIGKILLed.

A pass once read every process's environment on the machine: 25 ms at 1,100
processes, and an agent of a 1,024-wide job made several a second while its
instances ended (bench/scale.py: a quarter to a third of its CPU). What a
process carries is remembered here instead, by its pid and the inode of
``/proc/PID``, which the directory listing gives for free: a pid used again
by a new process is a new inode, so a process is read once, when first
listed, and a pass otherwise costs one listing. An environment does not
change but at exec, and a child read before its exec shows its parent's: a
descendant of an instance then shows the mark it inherits anyway. Only the
instances themselves gain a mark at exec (their parent is the agent or its
keeper), and they end with their process group, not through this. A process
to kill is read again just before, so nothing is killed on a remembered mark
alone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Iterable, Optional

from trainwarden.runtime.keeper import environment_mark

_VARIABLE = environment_mark("")
# A process that shows no environment at all is read again in each pass for
# this long: one caught inside exec shows its own a moment later, while a
# kernel thread or a zombie never does (most of a quiet machine's processes).
EMPTY_SETTLE_S = 1.0


def _marks_of(pid: int) -> Optional[frozenset[bytes]]:
    """The ``MARK_VARIABLE=...`` items of a process's environment (empty:
    none, or not ours to read); None when it showed none at all, to be read
    again: a kernel thread, a zombie, or a process caught inside exec."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except PermissionError:
        return frozenset()
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except PermissionError:
        return frozenset()
    except OSError:
        return None
    finally:
        os.close(fd)
    environ = b"".join(chunks)
    if not environ:
        return None
    if _VARIABLE not in environ:
        return frozenset()
    return frozenset(item for item in environ.split(b"\0") if item.startswith(_VARIABLE))


class MarkedProcesses:
    """Every process's marks as last read, by pid and /proc inode."""

    def __init__(self, proc: str = "/proc"):
        self._proc = proc
        # pid: (inode of /proc/PID, its marks or None while it shows no
        # environment, when it was first read showing none)
        self._known: dict[int, tuple[int, Optional[frozenset[bytes]], float]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # environments read, for the tests and benches

    def kill(self, marks: Iterable[str]) -> int:
        """SIGKILL every process carrying one of these incarnations' marks; how many."""
        wanted = {environment_mark(mark) for mark in marks if mark}
        if not wanted:
            return 0
        own = os.getpid()
        listing = {}
        with os.scandir(self._proc) as entries:
            for entry in entries:
                if entry.name.isdigit():
                    listing[int(entry.name)] = entry.inode()
        victims = []
        now = time.monotonic()
        with self._lock:
            known, fresh = self._known, {}
            for pid, inode in listing.items():
                if pid == own:
                    continue
                seen = known.get(pid)
                if seen is None or seen[0] != inode:
                    self.reads += 1
                    seen = (inode, _marks_of(pid), now)
                elif seen[1] is None and now - seen[2] < EMPTY_SETTLE_S:
                    self.reads += 1
                    seen = (inode, _marks_of(pid), seen[2])
                fresh[pid] = seen
                if seen[1] and not seen[1].isdisjoint(wanted):
                    victims.append(pid)
            self._known = fresh  # those no longer listed are forgotten
        killed = 0
        for pid in victims:
            again = _marks_of(pid)  # still the process remembered, still marked
            if again and not again.isdisjoint(wanted):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        return killed


_MARKED = MarkedProcesses()


def kill_incarnations(marks: Iterable[str]) -> int:
    """SIGKILL every process still carrying one of these incarnations' marks
    in its environment: descendants that left the process group. One listing
    of /proc, whatever the number of marks; environments read only of
    processes not seen before."""
    return _MARKED.kill(marks)
