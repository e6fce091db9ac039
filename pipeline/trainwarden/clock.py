"""Time for events: wall-clock seconds that never jump.

Anchored to the wall clock once per process and advanced by the monotonic
clock, so an NTP step cannot make a running job look hung (forward) or stall
its timers (backward); records still carry times close to the wall clock.

So the times of two processes are not one clock: processes started on either
side of a step differ by the step for as long as they run, and hosts differ
by their skew. No decision compares absolute times taken by different
processes (docs/MESSAGES.md, "Time"): each compares times of its own clock, and
ages cross process boundaries as durations.

A step of the wall clock is noticed (``now`` compares the wall clock's
progress with the monotonic clock's, at most once a second) and logged once,
with its size: it says why this process's times and the wall clock disagree.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

# A slew (NTP's gradual correction) moves the wall and monotonic clocks
# together; a disagreement that grows by this much between two checks is a step.
STEP_S = 1.0
CHECK_EVERY_S = 1.0

_log = logging.getLogger("trainwarden.clock")


class StepWatch:
    """Compares the wall clock with a step-free clock anchored to it; says
    (once per step) when the wall clock jumped, and by how much."""

    def __init__(self, wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = _log.warning):
        self._wall = wall
        self._mono = mono
        self._say = say
        self._lock = threading.Lock()
        self.wall0 = wall()
        self.mono0 = mono()
        self._next_check = self.mono0 + CHECK_EVERY_S
        # How far the wall clock is ahead of ours, as of the last check.
        self.offset = 0.0
        self.steps = 0

    def now(self) -> float:
        mono = self._mono()
        if mono >= self._next_check:
            self._check(mono)
        return self.wall0 + (mono - self.mono0)

    def _check(self, mono: float) -> None:
        with self._lock:
            if mono < self._next_check:
                return  # another thread checked meanwhile
            self._next_check = mono + CHECK_EVERY_S
            offset = self._wall() - (self.wall0 + (mono - self.mono0))
            step, self.offset = offset - self.offset, offset
            if abs(step) < STEP_S:
                return
            self.steps += 1
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall()))
        side = "behind" if offset > 0 else "ahead of"
        self._say(f"the wall clock stepped {step:+.1f} s (it now reads {when}); this process keeps its step-free "
                  f"time, now {abs(offset):.1f} s {side} the wall clock until it restarts: its timers are not "
                  "affected, the times it records are off by as much")


_watch = StepWatch()


def now() -> float:
    return _watch.now()


def wall_offset() -> float:
    """Seconds the wall clock is ahead of ``now()`` (as of the last check; 0 without a step)."""
    return _watch.offset
