"""Time for events: wall-clock seconds that never jump.

Anchored to the wall clock once per process and advanced by the monotonic
clock, so an NTP step cannot make a running job look hung (forward) or stall
its timers (backward); records still carry times close to the wall clock.
"""

from __future__ import annotations

import time

_WALL0 = time.time()
_MONO0 = time.monotonic()


def now() -> float:
    return _WALL0 + (time.monotonic() - _MONO0)
