"""Unix socket servers with bounded connections: the SDK endpoint
(runtime/control.py) and the C4D socket (runtime/c4d_source.py).

A job runs beside these servers and can connect as often as it likes. Every
accepted connection is an open file and, while it is served, a thread: left
unbounded, 20,000 connections from one job exhausted the agent's file
descriptors (its /metrics and its Kafka client with them). Here each
connection is given an origin when it is accepted (an incarnation, a job's
process, a collector), and one is refused at once, before any thread starts,
when its origin already holds ``per_origin`` connections or the server holds
``total``. ``total`` stays well below the process's file limit.

Refusals are counted (``RefusalLog``); each origin's first ``TOLD_PER_WINDOW``
of a window are told one by one (a dead letter with what was tried), the
others as one count when the window is over. A flood thus costs an accept
and a close per attempt, and a bounded number of reports per origin.
"""

from __future__ import annotations

import dataclasses
import resource
import socket
import socketserver
import threading
import time
from typing import Callable, Optional

# Connections pending accept: a flood must not leave a legitimate caller's
# connect without room in the backlog (socketserver's default is 5; a full
# backlog fails a non-blocking connect at once, which the SDK retries).
BACKLOG = 1024
REPORT_EVERY_S = 10.0
TOLD_PER_WINDOW = 10
# Past this many origins with untold refusals, the rest are counted only.
MAX_ORIGINS = 1024


def total_cap(wanted: int) -> int:
    """``wanted``, but at most a quarter of this process's file limit: the
    agent's other files (Kafka, output files, pipes) keep their room."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft // 4))


@dataclasses.dataclass
class _Window:
    since: float
    told: int = 0
    count: int = 0  # refused, not told one by one
    reason: str = ""


class RefusalLog:
    """Counts every refusal; ``refuse`` says whether to tell this one now.
    ``flush`` tells, as one count per origin, those of windows that ended."""

    def __init__(self, tell_count: Callable[[str, str, int], None], every_s: float = REPORT_EVERY_S,
                 told_per_window: int = TOLD_PER_WINDOW, clock: Callable[[], float] = time.monotonic):
        self.tell_count = tell_count  # (origin, last reason, refusals not told one by one)
        self.every_s = every_s
        self.told_per_window = told_per_window
        self.clock = clock
        self.total = 0
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def refuse(self, origin: str, reason: str) -> bool:
        with self._lock:
            self.total += 1
            now = self.clock()
            window = self._windows.get(origin)
            if window is not None and now - window.since >= self.every_s:
                ended = self._windows.pop(origin)
                if ended.count:
                    self._tell(origin, ended)
                window = None
            if window is None:
                if len(self._windows) >= MAX_ORIGINS:
                    return False
                window = self._windows[origin] = _Window(since=now)
            if window.told < self.told_per_window:
                window.told += 1
                return True
            window.count += 1
            window.reason = reason
            return False

    def flush(self) -> None:
        now = self.clock()
        with self._lock:
            ended = [(origin, w) for origin, w in self._windows.items() if now - w.since >= self.every_s]
            for origin, _ in ended:
                del self._windows[origin]
        for origin, window in ended:
            if window.count:
                self._tell(origin, window)

    def _tell(self, origin: str, window: _Window) -> None:
        try:
            self.tell_count(origin, window.reason, window.count)
        except Exception:  # noqa: BLE001 - a report must not stop the server
            pass


@dataclasses.dataclass(frozen=True)
class Admitted:
    origin: str
    peer: object  # whatever origin_of found out about the caller (control.Peer)


class BoundedUnixServer(socketserver.ThreadingUnixStreamServer):
    """``origin_of(request)`` -> (origin, peer) of a new connection (an
    OSError refuses it); ``cap_of(origin)`` its origin's limit;
    ``on_over_cap(request, origin, reason, tell)`` answers a refused one
    before it is closed (``tell``: the RefusalLog lets this one be reported)."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, path: str, handler, *, total: int, origin_of: Callable[[socket.socket], tuple[str, object]],
                 cap_of: Callable[[str], int], refusals: RefusalLog,
                 on_over_cap: Optional[Callable[[socket.socket, str, str, bool], None]] = None):
        self.total = total_cap(total)
        self.origin_of = origin_of
        self.cap_of = cap_of
        self.refusals = refusals
        self.on_over_cap = on_over_cap
        self.open = 0
        self.idle_closed = 0
        self._by_origin: dict[str, int] = {}
        self._admitted: dict[int, Admitted] = {}
        self._lock = threading.Lock()
        super().__init__(path, handler)

    def admitted(self, request: socket.socket) -> Admitted:
        with self._lock:
            return self._admitted[id(request)]

    def verify_request(self, request, client_address) -> bool:
        try:
            origin, peer = self.origin_of(request)
        except OSError:
            return False
        with self._lock:
            held = self._by_origin.get(origin, 0)
            if self.open < self.total and held < self.cap_of(origin):
                self.open += 1
                self._by_origin[origin] = held + 1
                self._admitted[id(request)] = Admitted(origin, peer)
                return True
            reason = (f"{held} connections of {origin} are open, the most it may hold" if held >= self.cap_of(origin)
                      else f"{self.open} connections are open, the most this endpoint serves at once")
        tell = self.refusals.refuse(origin, reason)
        if self.on_over_cap is not None:
            try:
                self.on_over_cap(request, origin, reason, tell)
            except Exception:  # noqa: BLE001 - a refusal must not stop the server
                pass
        return False

    def shutdown_request(self, request) -> None:
        with self._lock:
            admitted = self._admitted.pop(id(request), None)
            if admitted is not None:
                self.open -= 1
                left = self._by_origin[admitted.origin] - 1
                if left:
                    self._by_origin[admitted.origin] = left
                else:
                    del self._by_origin[admitted.origin]
        super().shutdown_request(request)

    def service_actions(self) -> None:
        # Called by serve_forever about every poll interval (0.5 s).
        self.refusals.flush()


def read_line(conn: socket.socket, limit: int, deadline_s: float) -> bytes:
    """Bytes up to and including the first newline (or EOF, or ``limit`` + 1
    bytes), all within ``deadline_s``: a caller that trickles its request one
    byte at a time is cut off like one that sends nothing (socket.timeout)."""
    deadline = time.monotonic() + deadline_s
    data = bytearray()
    while len(data) <= limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no whole request in time")
        conn.settimeout(left)
        chunk = conn.recv(min(65536, limit + 1 - len(data)))
        if not chunk:
            break
        data += chunk
        end = data.find(b"\n")
        if end >= 0:
            return bytes(data[:end + 1])
    return bytes(data)
