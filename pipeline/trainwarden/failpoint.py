"""A test hook: named points where a service can be made to die.

``TRAINWARDEN_FAILPOINT=<name>`` in a service's environment makes it exit at
once (``os._exit``: no cleanup, no ``finally``, like a SIGKILL there) the
first time it reaches the point of that name; unset, as in any deployment,
``reach`` does nothing. The crash tests (tests/cluster/test_actuator_crash_kafka.py)
kill the actuator at each step of a restart this way: a SIGKILL sent from
outside could not land between two steps a few milliseconds apart every time.

What the process sent before the point reaches the bus (``settle_with``):
it is what a crash a moment later would have left behind, and a point
between two commands means nothing if the first one was still in a buffer.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

ENV = "TRAINWARDEN_FAILPOINT"
EXIT_CODE = 86

_settle: Optional[Callable[[], None]] = None


def settle_with(settle: Callable[[], None]) -> None:
    """What to run before dying at a point (the service's producer flush)."""
    global _settle
    _settle = settle


def reach(name: str) -> None:
    """Die here if this point is the one armed; otherwise nothing."""
    if os.environ.get(ENV) != name:
        return
    if _settle is not None:
        try:
            _settle()
        except Exception:  # noqa: BLE001 - the point is to die here, whatever the bus says
            pass
    sys.stderr.write(f"trainwarden: failpoint {name} reached ({ENV}): exiting with {EXIT_CODE}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
