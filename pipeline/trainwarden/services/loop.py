"""The one service loop: every service (agent, processor, actuator,
notifier) is a ``run_once`` driven here until asked to stop.

A bus outage is waited out (the clients reconnect by themselves) and said
once; any other error of one iteration is reported and the loop goes on, with
a growing pause, so one bad message never stops a service. A reload (SIGHUP)
runs here, between two iterations, so that it never races the service.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional, Protocol

from trainwarden.bus import BusError

HEALTH_EVERY_S = 30.0


class Service(Protocol):
    counters: object

    def run_once(self) -> None: ...
    def close(self) -> None: ...


class LoopObserver(Protocol):
    def loop_ran(self, bus_error: str = "") -> None: ...


def serve(service: Service, stopping: Callable[[], bool], say: Callable[[str, str], None],
          health_every_s: float = HEALTH_EVERY_S, observer: Optional[LoopObserver] = None,
          reload_requested: Callable[[], bool] = lambda: False, reload: Optional[Callable[[], None]] = None) -> None:
    """Run ``service`` until ``stopping()``; ``say(level, text)`` with level
    info, warning, error or health. ``reload()`` runs when
    ``reload_requested()`` says so. Closes the service at the end."""
    next_health = time.monotonic() + health_every_s
    bus_down = ""
    errors = 0  # in the service's life, for the log
    failing = 0  # in a row, for the pause
    try:
        while not stopping():
            if reload is not None and reload_requested():
                reload()
            try:
                service.run_once()
                failing = 0
                if bus_down:
                    say("info", "the bus is back")
                    bus_down = ""
            except BusError as exc:
                if bus_down != str(exc):
                    say("warning", f"{exc} (retrying)")
                    bus_down = str(exc)
                _pause(1.0, stopping)
            except Exception as exc:  # noqa: BLE001 - a service must outlive one bad iteration
                errors += 1
                failing += 1
                say("error", f"internal error {exc!r} (error {errors}; continuing)")
                if os.environ.get("TRAINWARDEN_DEBUG"):
                    raise
                # The pause grows only while iterations keep failing: errors
                # spread over a long life must not add up to a 30 s stall.
                _pause(min(30.0, 0.5 * failing), stopping)
            if observer is not None:
                observer.loop_ran(bus_down)
            if time.monotonic() >= next_health:
                counters = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(service.counters).items())
                say("health", f"healthy; {counters}")
                next_health = time.monotonic() + health_every_s
    finally:
        service.close()


def _pause(seconds: float, stopping: Callable[[], bool]) -> None:
    """A pause that a stop request cuts short: SIGTERM must not wait out a backoff."""
    deadline = time.monotonic() + seconds
    while not stopping() and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
