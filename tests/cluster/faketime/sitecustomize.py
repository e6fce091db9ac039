"""Loaded (from PYTHONPATH) by every Python process that tests/cluster/processes.py
runs under libfaketime, and by their children.

libfaketime 0.9.10 (Debian 12's `faketime`) breaks ``time.sleep`` of Python
3.11 and later when only the wall clock is faked: Python sleeps with
clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), whose deadline libfaketime
shifts by the fake offset, and the kernel answers EINVAL
(https://github.com/wolfcw/libfaketime/issues/426, fixed after 0.9.10). A
sleep of a relative length in select(), which libfaketime leaves alone when it
only offsets the clock, waits as long."""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)  # retried on EINTR with the time left (PEP 475)


time.sleep = _sleep
