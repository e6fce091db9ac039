"""The one service loop: every service (agent, processor, actuator,
notifier) and ``trainwarden run``'s supervision is a ``run_once`` driven
here, and the loop owns the timing.

A service with timers (``Ticking``: the run and the processor, whose engines
judge silence and lateness only on ticks) says what one iteration does
(``run_once(timeout_s)``: take the input there is, waiting for it at most
``timeout_s``) and what a tick does (``tick()``); the loop gives it a tick
every ``TICK_S``, the one tick period, and never lets it wait for input past
the next one. A service without timers waits for its input as it pleases.

``serve`` runs a service until asked to stop. A bus outage is waited out
(the clients reconnect by themselves) and said once; any other error of one
iteration is reported and the loop goes on, with a growing pause, so one bad
message never stops a service. A reload (SIGHUP) runs here, between two
iterations, so that it never races the service. ``ServiceLoop.until`` is
the same loop without that guard, for ``trainwarden run``: an error there
ends the run, which stops its instances and says why.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional, Protocol, runtime_checkable

from trainwarden.bus import BusError
from trainwarden.clock import now as clock_now

HEALTH_EVERY_S = 30.0
# The one tick period. Timers (hang, exit hang, a failure waiting for its
# attribution) fire at most this long after they are due.
TICK_S = 0.2


class Service(Protocol):
    counters: object

    def run_once(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Ticking(Protocol):
    """A service with timers: ``run_once`` waits for input at most
    ``timeout_s``; ``tick()`` runs its timers, on its own clock."""

    def run_once(self, timeout_s: float) -> None: ...
    def tick(self) -> None: ...


class ServiceLoop:
    """The timing of one service: its iterations, and its ticks if it has
    timers. ``clock`` schedules the ticks (a test pins it)."""

    def __init__(self, service, clock: Callable[[], float] = clock_now):
        self.service = service
        self.clock = clock
        self.ticking = isinstance(service, Ticking)
        self.next_tick = clock() + TICK_S

    def once(self) -> None:
        """One iteration: the input that comes until the next tick is due,
        then the tick if it is. A tick never comes before what was already
        read is taken, nor later than one iteration after it is due."""
        if not self.ticking:
            self.service.run_once()
            return
        self.service.run_once(max(0.0, self.next_tick - self.clock()))
        if self.clock() >= self.next_tick:
            self.service.tick()
            # From the end of this tick: however long ticks take, input gets a full period between two.
            self.next_tick = self.clock() + TICK_S

    def until(self, stopping: Callable[[], bool]) -> None:
        """Iterations until ``stopping()``; an error ends the loop (no guard)."""
        while not stopping():
            self.once()


class LoopObserver(Protocol):
    def loop_ran(self, bus_error: str = "") -> None: ...


def serve(service: Service, stopping: Callable[[], bool], say: Callable[[str, str], None],
          health_every_s: float = HEALTH_EVERY_S, observer: Optional[LoopObserver] = None,
          reload_requested: Callable[[], bool] = lambda: False, reload: Optional[Callable[[], None]] = None,
          counters: Optional[Callable[[], dict]] = None, clock: Callable[[], float] = clock_now) -> None:
    """Run ``service`` until ``stopping()``; ``say(level, text)`` with level
    info, warning, error or health. ``reload()`` runs when
    ``reload_requested()`` says so. ``counters()``: the health line's
    (the service's own by default). Closes the service at the end."""
    loop = ServiceLoop(service, clock)
    counted = counters or (lambda: dataclasses.asdict(service.counters))
    next_health = time.monotonic() + health_every_s
    bus_down = ""
    errors = 0  # in the service's life, for the log
    failing = 0  # in a row, for the pause
    try:
        while not stopping():
            if reload is not None and reload_requested():
                reload()
            try:
                loop.once()
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
                say("health", "healthy; " + ", ".join(f"{k} {v}" for k, v in counted().items()))
                next_health = time.monotonic() + health_every_s
    finally:
        service.close()


def _pause(seconds: float, stopping: Callable[[], bool]) -> None:
    """A pause that a stop request cuts short: SIGTERM must not wait out a backoff."""
    deadline = time.monotonic() + seconds
    while not stopping() and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
