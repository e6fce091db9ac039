"""Running one service as a process: its log, its metrics endpoint, its
signals. SIGTERM and SIGINT stop it; SIGHUP asks for a reload (rules,
subscriptions): the new configuration is read and checked in a thread of its
own while the loop goes on serving (a large rules directory takes seconds to
parse), and swapped in by the loop between two iterations once it is valid;
an invalid one is logged and counted, and the previous one stays.
A service opens its bus here: signed when a key is configured (and then its
refusals are in the health line and /metrics), refused on a broker off this
host without one unless the network is declared trusted (bus/signing.py)."""

from __future__ import annotations

import dataclasses
import functools
import signal
import threading
from typing import Any, Callable, Optional

from trainwarden.bus import open_bus
from trainwarden.bus.signing import REFUSALS, SigningBus, SigningCounters, describe
from trainwarden.services.logs import ServiceLog
from trainwarden.services.loop import serve
from trainwarden.services.observability import Address, MetricsServer, Observer


@dataclasses.dataclass(frozen=True)
class Reload:
    """What a SIGHUP reloads. ``parse()`` reads and checks the new
    configuration, off the loop (it raises for an invalid one); ``swap(new)``
    puts it in place, on the loop between two iterations, and returns the line
    to log; ``refused(error)`` is the line to log when ``parse`` raised."""

    parse: Callable[[], Any]
    swap: Callable[[Any], str]
    refused: Callable[[Exception], str]


class _Reloader:
    """One parse at a time, in a daemon thread (a stopping service does not
    wait for it); SIGHUPs that come during a parse make one more parse after
    it, of the files as they are then."""

    def __init__(self, reload: Reload, requested: Callable[[], bool], say: Callable[[str, str], None]):
        self.reload = reload
        self.requested = requested
        self.say = say
        self.counts = {"swapped": 0, "refused": 0}
        self._thread: Optional[threading.Thread] = None
        self._parsed = threading.Event()
        self._outcome: tuple[bool, Any] = (False, None)

    def ready(self) -> bool:
        """Asked by the loop before each iteration: starts a parse when one
        was requested and none runs; True when one has ended (``swap_in``)."""
        if self._thread is None and self.requested():
            self._parsed.clear()
            self._thread = threading.Thread(target=self._parse, name="reload", daemon=True)
            self._thread.start()
        return self._parsed.is_set()

    def swap_in(self) -> None:
        """On the loop, between two iterations: the parsed configuration goes in, or the refusal is said."""
        ok, value = self._outcome
        self._thread, self._outcome = None, (False, None)
        self._parsed.clear()
        if ok:
            try:
                said = self.reload.swap(value)
            except Exception as exc:  # noqa: BLE001 - the loop calls this outside its guard: no error may end it
                ok, value = False, exc
        if ok:
            self.counts["swapped"] += 1
            self.say("info", said)
        else:
            self.counts["refused"] += 1
            self.say("error", self.reload.refused(value))

    def _parse(self) -> None:
        try:
            self._outcome = (True, self.reload.parse())
        except Exception as exc:  # noqa: BLE001 - whatever the cause, the previous configuration stays
            self._outcome = (False, exc)
        self._parsed.set()


class ServiceRun:
    def __init__(self, component: str, log_format: str = "text", metrics_address: Optional[Address] = None):
        """Raises OSError when the metrics address cannot be listened on."""
        self.log = ServiceLog(component, log_format)
        self.log.install()
        self.observer = Observer(component)
        self.server: Optional[MetricsServer] = None
        if metrics_address is not None:
            self.server = self.observer.serve_http(metrics_address)
        self._stopping = threading.Event()
        self._reload = threading.Event()
        self._refusals: Optional[SigningCounters] = None
        self._signing = ""
        # From now on a SIGHUP never stops the service, even while it starts
        # (the actuator reads its state topic first); SIGTERM still interrupts
        # a start at once (main's handler), and run() takes it over.
        signal.signal(signal.SIGHUP, lambda signum, frame: self._reload.set())

    def say(self, level: str, text: str, job_id: str = "") -> None:
        self.log(level, text, job_id)

    def open_bus(self, target: Optional[str], *, key_file: Optional[str] = None,
                 trusted_network: Optional[bool] = None, max_age_s: Optional[float] = None,
                 accept_unsigned_logs: Optional[bool] = None):
        """The service's bus, observed; raises ConfigError (a bad key, a
        refused network) before anything connects."""
        bus = open_bus(target, key_file=key_file, trusted_network=trusted_network, max_age_s=max_age_s,
                       service=self.observer.component, accept_unsigned_logs=accept_unsigned_logs)
        self._signing = describe(bus)
        if isinstance(bus, SigningBus):
            refusals = self._refusals = bus.counters
            self.observer.counter_family("bus_messages_refused", "Bus messages refused by signature checks and "
                                         "dead-lettered, by reason.", "reason",
                                         lambda: {reason: getattr(refusals, reason) for reason in REFUSALS})
        return self.observer.bus(bus)

    def run(self, service, label: str, reload: Optional[Reload] = None) -> int:
        def stop(signum, frame) -> None:
            self._stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        if reload is None:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing to reload is still no reason to stop
        where = f"; metrics on http://{self.server.address}/metrics" if self.server else ""
        signing = f"; {self._signing}" if self._signing else ""
        self.say("info", f"running: {label}{where}{signing}")
        # The health line's counters: a signed bus's refusals too.
        counters = functools.partial(_with_refusals, service, self._refusals) \
            if self._refusals is not None else None
        reloader = None
        if reload is not None:
            reloader = _Reloader(reload, self._take_reload, self.say)
            self.observer.counter_family("reloads", "SIGHUP reloads by outcome: swapped (in use from then on), "
                                         "refused (invalid; the previous configuration stays).", "outcome",
                                         lambda: dict(reloader.counts))
        try:
            serve(service, self._stopping.is_set, self.say, observer=self.observer,
                  reload_requested=reloader.ready if reloader else (lambda: False),
                  reload=reloader.swap_in if reloader else None, counters=counters)
        finally:
            self.close()
        self.say("info", "stopped")
        return 0

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _take_reload(self) -> bool:
        if not self._reload.is_set():
            return False
        self._reload.clear()
        return True


def _with_refusals(service, refusals: SigningCounters) -> dict:
    """A service's counters for its health line, with its bus's signature refusals."""
    return {**dataclasses.asdict(service.counters),
            **{f"refused_{reason}": getattr(refusals, reason) for reason in REFUSALS},
            "refusals_not_dead_lettered": refusals.dead_letters_lost}
