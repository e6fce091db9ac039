"""What operators and Kubernetes see of a running service: Prometheus metrics
at ``/metrics``, liveness at ``/healthz``, readiness at ``/readyz``.

One ``Observer`` per service, each with its own ``CollectorRegistry`` (not
the process-global one), so that several services can run in one process
(tests) without their metrics colliding. The services stay unaware of it:
their counters are read at scrape time, consumer lag comes from a wrapper
around the bus, and the service loop reports each iteration.

Metrics (every name starts with ``trainwarden_``; docs/OPERATIONS.md lists them):

- ``trainwarden_<component>_<counter>_total``: the counters the service keeps
  (``trainwarden_processor_log_lines_total``, ``trainwarden_actuator_decisions_total``, ...)
- ``trainwarden_consumer_lag{group,topic,partition}``: messages not yet read
- ``trainwarden_decision_latency_seconds``, ``trainwarden_delivery_latency_seconds``: histograms
- ``trainwarden_build_info{version,component}``, ``trainwarden_loop_iterations_total``,
  ``trainwarden_loop_last_run_age_seconds``
"""

from __future__ import annotations

import dataclasses
import http.server
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence
from urllib.parse import urlsplit


# A loop iteration takes well under a second; one that has not ended for this
# long is stuck (a liveness probe should restart the service).
STALE_S = 60.0
LAG_EVERY_S = 1.0
CONNECT_TIMEOUT_S = 1.0
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclasses.dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """HOST:PORT (``[::1]:9464`` for IPv6, ``:9464`` for every interface)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT (for example 0.0.0.0:9464)")
    number = int(port)
    if not 1 <= number <= 65535:
        raise ValueError(f"the port of {text!r} must be from 1 to 65535")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return Address(host or "0.0.0.0", number)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("trainwarden")
    except PackageNotFoundError:
        return "unknown"


def _prom():
    # Imported on first use: `pip install trainwarden` (run and the SDK) has
    # no prometheus_client; the services come with the [kafka] extra, which has.
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError:
        from trainwarden.bus import BusError

        raise BusError("the services' metrics need prometheus_client, which is not installed.",
                       hint="pip install 'trainwarden[kafka]'") from None
    return prometheus_client


class Observer:
    """Metrics, health and readiness of one service (``component``)."""

    def __init__(self, component: str, clock: Callable[[], float] = time.monotonic, stale_after_s: float = STALE_S):
        self.component = component
        self.clock = clock
        self.stale_after_s = stale_after_s
        prom = _prom()
        self.registry = prom.CollectorRegistry()
        prom.Info("trainwarden_build", "The Trainwarden version this service runs.",
             registry=self.registry).info({"version": version(), "component": component})
        self.iterations = prom.Counter("trainwarden_loop_iterations", "Iterations of the service loop.",
                                  registry=self.registry)
        self.lags: dict[str, "LagTracker"] = {}
        self._counters: Optional[Callable[[], object]] = None
        self._gauges: list[tuple[str, str, Callable[[], float]]] = []
        self._families: list[tuple[str, str, str, Callable[[], Mapping[str, float]]]] = []
        self._checks: list[Callable[[], str]] = []
        self._histograms: dict[str, "prometheus_client.Histogram"] = {}
        self.last_run: Optional[float] = None
        self.bus_error = ""
        self.registry.register(_ServiceCollector(self))

    # ------------------------------------------------------ what to show

    def watch(self, counters: Callable[[], object], gauges: Sequence[tuple[str, str, Callable[[], float]]] = ()) -> None:
        """``counters()`` returns the service's counters dataclass, read at each
        scrape; ``gauges`` are (name, help, value) read the same way."""
        self._counters = counters
        self._gauges = list(gauges)

    def counter_family(self, name: str, documentation: str, label: str,
                       read: Callable[[], Mapping[str, float]]) -> None:
        """A counter with one sample per key of ``read()`` (``label`` = key)."""
        self._families.append((name, documentation, label, read))

    def readiness_check(self, check: Callable[[], str]) -> None:
        """``check()`` returns "" when fine, else one sentence why not."""
        self._checks.append(check)

    def histogram(self, name: str, documentation: str) -> "prometheus_client.Histogram":
        if name not in self._histograms:
            self._histograms[name] = _prom().Histogram(f"trainwarden_{name}", documentation, buckets=LATENCY_BUCKETS,
                                               registry=self.registry)
        return self._histograms[name]

    def bus(self, bus) -> "ObservedBus":
        self.readiness_check(lambda: bus_reachable(bus))
        return ObservedBus(bus, self)

    # ------------------------------------------------------ the loop's report

    def loop_ran(self, bus_error: str = "") -> None:
        """Called by the service loop after every iteration (from its thread)."""
        self.iterations.inc()
        self.bus_error = bus_error
        self.last_run = self.clock()

    def health(self) -> tuple[int, str]:
        if self.last_run is None:
            return 503, "starting: the service loop has not run yet"
        age = self.clock() - self.last_run
        if age > self.stale_after_s:
            return 503, f"the service loop has not run for {age:.0f} s"
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        status, why = self.health()
        if status != 200:
            return status, why
        if self.bus_error:
            return 503, f"the bus: {self.bus_error}"
        for check in self._checks:
            try:
                problem = check()
            except Exception as exc:  # noqa: BLE001 - a failing check is a reason, not a crash of the endpoint
                problem = f"a readiness check failed: {type(exc).__name__}: {exc}"
            if problem:
                return 503, problem
        return 200, "ready"

    # ------------------------------------------------------ HTTP

    def serve_http(self, address: Address) -> "MetricsServer":
        return MetricsServer(self, address)


class _ServiceCollector:
    """The service's own counters and gauges, read when Prometheus scrapes."""

    def __init__(self, observer: Observer):
        self.observer = observer

    def collect(self) -> Iterable:
        core = _prom().core
        CounterMetricFamily, GaugeMetricFamily = core.CounterMetricFamily, core.GaugeMetricFamily  # noqa: N806
        o = self.observer
        if o._counters is not None:
            for name, value in dataclasses.asdict(o._counters()).items():
                yield CounterMetricFamily(f"trainwarden_{o.component}_{name}",
                                          f"{o.component}: {name.replace('_', ' ')}", value=value)
        for name, documentation, read in o._gauges:
            yield GaugeMetricFamily(f"trainwarden_{name}", documentation, value=read())
        for name, documentation, label, read in o._families:
            family = CounterMetricFamily(f"trainwarden_{name}", documentation, labels=[label])
            for key, value in sorted(read().items()):
                family.add_metric([key], value)
            yield family
        lag = GaugeMetricFamily("trainwarden_consumer_lag", "Messages of a partition this consumer group has not "
                                "read yet.", labels=["group", "topic", "partition"])
        for group, tracker in list(o.lags.items()):
            for (topic, partition), value in tracker.lags.items():
                lag.add_metric([group, topic, str(partition)], value)
        yield lag
        if o.last_run is not None:
            yield GaugeMetricFamily("trainwarden_loop_last_run_age_seconds",
                                    "Seconds since the service loop last finished an iteration.",
                                    value=max(0.0, o.clock() - o.last_run))


class MetricsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on a thread of their own."""

    def __init__(self, observer: Observer, address: Address):
        handler = _handler(observer)
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        server_class = type("Server", (http.server.ThreadingHTTPServer,), {"address_family": family,
                                                                           "daemon_threads": True})
        # OSError (address in use, not an address of this host) reaches the caller.
        self.server = server_class((address.host, address.port), handler)
        self.address = Address(address.host, self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="tw-metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(observer: Observer):
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "trainwarden"

        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            path = urlsplit(self.path).path
            if path == "/metrics":
                prom = _prom()
                self._answer(200, prom.generate_latest(observer.registry), prom.CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                status, text = observer.health() if path == "/healthz" else observer.readiness()
                self._answer(status, (text + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._answer(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002 - scrapes every 15 s are not news
            pass

    return Handler


# ------------------------------------------------------------ consumer lag


class LagTracker:
    def __init__(self):
        self.lags: dict[tuple[str, int], int] = {}


class ObservedBus:
    """The bus with each group consumer's lag measured as it polls (on the
    service's own thread: a Kafka client is not to be shared with the
    metrics thread)."""

    def __init__(self, bus, observer: Observer):
        self._bus = bus
        self._observer = observer

    def consumer(self, topics, group, from_beginning: bool = False, on_assign=None, fetch_wait_s=None):
        inner = self._bus.consumer(topics, group, from_beginning=from_beginning, on_assign=on_assign,
                                   fetch_wait_s=fetch_wait_s)
        if group is None:
            return inner
        tracker = self._observer.lags.setdefault(group, LagTracker())
        return _LagConsumer(inner, tracker, self._observer.clock)

    def __getattr__(self, name: str):
        return getattr(self._bus, name)


class _LagConsumer:
    def __init__(self, inner, tracker: LagTracker, clock: Callable[[], float]):
        self._inner = inner
        self._tracker = tracker
        self._clock = clock
        self._next = 0.0

    def poll(self, timeout_s: float, max_records: int = 500):
        records = self._inner.poll(timeout_s, max_records)
        if self._clock() >= self._next:
            self._next = self._clock() + LAG_EVERY_S
            self._tracker.lags = self._inner.lags()
        return records

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


# ------------------------------------------------------------ readiness checks


def _connects(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return ""
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def bus_reachable(bus) -> str:
    """"" when a broker of the bus accepts a connection (the in-process bus always does)."""
    bootstrap = getattr(bus, "bootstrap", None)
    if not bootstrap:
        return ""
    problems = []
    for server in str(bootstrap).split(","):
        try:
            address = parse_address(server)
        except ValueError:
            problems.append(f"{server!r} is not HOST:PORT")
            continue
        problem = _connects(address.host, address.port)
        if not problem:
            return ""
        problems.append(f"{server}: {problem}")
    return f"the Kafka brokers cannot be reached ({'; '.join(problems)})"


def directory_writable(directory: Path, what: str) -> str:
    """"" when a file can be created in ``directory`` (made if missing), as the service's writes will."""
    probe = directory / f".ready-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        return ""
    except OSError as exc:
        return f"{what} {directory} is not writable ({exc.strerror or exc})"


def store_writable(target: str) -> str:
    """The history store: a directory's spool takes a file, a server accepts a connection."""
    if "://" in target and urlsplit(target).scheme.lower() != "file":
        parts = urlsplit(target)
        default = 443 if parts.scheme.lower() == "https" else 8123
        problem = _connects(parts.hostname or "localhost", parts.port or default)
        return f"the history store at {parts.hostname}:{parts.port or default} cannot be reached ({problem})" \
            if problem else ""
    path = urlsplit(target).path if target.startswith("file://") else target
    return directory_writable(Path(path) / "spool", "the history store's spool")


class ObservedDeliveries:
    """A delivery-log writer that also times each delivery, from the event to
    the receiver's answer, into the delivery latency histogram."""

    def __init__(self, writer, histogram: "prometheus_client.Histogram"):
        self._writer = writer
        self._histogram = histogram

    def write(self, records) -> None:
        self._writer.write(records)
        for record in records:
            if record.status == "delivered" and record.time:
                self._histogram.observe(max(0.0, record.updated_at - record.time))

    def __getattr__(self, name: str):
        return getattr(self._writer, name)
