"""The one service loop: every service (agent, processor, actuator,
notifier) is a ``run_once`` driven here until asked to stop.

A bus outage is waited out (the clients reconnect by themselves) and said
once; any other error of one iteration is reported and the loop goes on, with
a growing pause, so one bad message never stops a service.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Protocol

from trainwarden.bus import BusError

HEALTH_EVERY_S = 30.0


class Service(Protocol):
    counters: object

    def run_once(self) -> None: ...
    def close(self) -> None: ...


def serve(service: Service, stopping: Callable[[], bool], say: Callable[[str, str], None],
          health_every_s: float = HEALTH_EVERY_S) -> None:
    """Run ``service`` until ``stopping()``; ``say(level, text)`` with level
    info, warning, error or health. Closes the service at the end."""
    next_health = time.monotonic() + health_every_s
    bus_down = ""
    errors = 0
    try:
        while not stopping():
            try:
                service.run_once()
                if bus_down:
                    say("info", "the bus is back")
                    bus_down = ""
            except BusError as exc:
                if bus_down != str(exc):
                    say("warning", f"{exc} (retrying)")
                    bus_down = str(exc)
                time.sleep(1.0)
            except Exception as exc:  # noqa: BLE001 - a service must outlive one bad iteration
                errors += 1
                say("error", f"internal error {exc!r} (error {errors}; continuing)")
                if os.environ.get("TRAINWARDEN_DEBUG"):
                    raise
                time.sleep(min(30.0, 0.5 * errors))
            if time.monotonic() >= next_health:
                counters = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(service.counters).items())
                say("health", f"healthy; {counters}")
                next_health = time.monotonic() + health_every_s
    finally:
        service.close()
