"""Waiting on a condition in a test (never a fixed sleep): polled every 20 ms."""

from __future__ import annotations

import time


def wait_for_value(predicate, timeout_s: float, what: str):
    """What ``predicate`` returned once it was true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s} s")
