"""The SDK's endpoint on this machine: a Unix socket bound to process trees.

The socket lives in a directory only this user can enter (0700). A request
carries no credential: the kernel says which process connected (SO_PEERCRED),
and the request belongs to the incarnation whose root process that is, or is
an ancestor of it by parent chain (read from /proc/PID/stat). Whatever the
request says, and whatever the caller copied from another job's environment,
it speaks for its own incarnation only; a process in no incarnation's tree is
refused. A descendant that started a session of its own (setsid) keeps its
parent and stays its instance's; one that was reparented (a double-forked
daemon, or any child once the instance's root process died) is in no tree
any more and is refused.

Each incarnation has a marker (``TRAINWARDEN_TOKEN`` in its environment): it
finds the incarnation's processes for stack dumps and for killing escaped
children, and keys the bookkeeping here; it is no credential.

A valid request becomes an SdkMessage handed to the service loop together
with a reply slot; the answer is sent only once the loop has stepped the
engine with it, so a keyword set just before a crash is always known when
that crash is judged.

Connections are bounded (runtime/connections.py): one incarnation holds at
most ``MAX_CALLS_PER_INCARNATION`` at once (the processes of no incarnation
together as many), the endpoint at most ``MAX_CONNECTIONS``, and a
connection that has not sent its whole request within ``IDLE_S`` is closed.
One over a limit is answered with the reason and closed at once; refusals
are counted, and told (``on_refused``) a few per origin per window.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import socket
import socketserver
import struct
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

from trainwarden.clock import now
from trainwarden.events import SdkMessage, SdkOp
from trainwarden.runtime.connections import BoundedUnixServer, RefusalLog, read_line
from trainwarden.sdk import protocol

# Longer than a restart's stop grace, so an SDK call made while the loop is
# stopping instances is still taken; the SDK client waits a little longer.
REPLY_WAIT_S = 25.0
# An incarnation is registered before its process exists and bound to the
# pid once it does: a call in between waits this long for the binding.
BIND_WAIT_S = 5.0
MAX_CHAIN = 4096  # ancestors walked at most (a pid namespace's depth is far below)
SOCKET_NAME = "sdk.sock"
# sun_path holds 108 bytes; a long TMPDIR falls back to /tmp.
MAX_SOCKET_PATH = 100
# SDK calls one incarnation may have open at once: each of its processes
# (torchrun's workers, their threads) waits on its own. Past it a call is refused.
MAX_CALLS_PER_INCARNATION = 16
# Connections open at once in all (at most a quarter of the process's file limit).
MAX_CONNECTIONS = 256
# The SDK sends its request right after connecting: a connection without a
# whole request by then is closed.
IDLE_S = 5.0
UNKNOWN_ORIGIN = "processes of no running incarnation"


@dataclasses.dataclass(frozen=True)
class Peer:
    """A connected process as the kernel reports it."""
    pid: int
    uid: int


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return Peer(pid, uid)


def stat_of(pid: int) -> Optional[tuple[int, int]]:
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def ancestry(pid: int) -> Iterator[tuple[int, int]]:
    """(pid, start time) of the process and each of its ancestors, up to init."""
    for _ in range(MAX_CHAIN):
        if pid <= 0:
            return
        found = stat_of(pid)
        if found is None:
            return
        parent, started = found
        yield pid, started
        if parent == pid:
            return
        pid = parent


def uid_of(pid: int) -> Optional[int]:
    """The effective uid, the one SO_PEERCRED reports."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def descends_from(pid: int, ancestor: int) -> bool:
    """True for a strict descendant of ``ancestor`` by parent chain."""
    return any(p == ancestor for p, _ in list(ancestry(pid))[1:])


def private_socket_path() -> Path:
    """A fresh socket path in a new directory that only this user can enter."""
    directory = Path(tempfile.mkdtemp(prefix="tw-sdk-"))  # mode 0700
    if len(str(directory / SOCKET_NAME)) > MAX_SOCKET_PATH:
        directory.rmdir()
        directory = Path(tempfile.mkdtemp(prefix="tw-sdk-", dir="/tmp"))
    return directory / SOCKET_NAME


@dataclasses.dataclass(frozen=True)
class Incarnation:
    job_id: str
    instance: str
    round: int
    start: int


@dataclasses.dataclass(frozen=True)
class _Root:
    """The process an incarnation's tree hangs from; the start time tells a
    reused pid from the original."""
    pid: int
    started: int
    uid: Optional[int]


class PendingReply:
    """A request waiting for the service loop."""

    def __init__(self, message: SdkMessage):
        self.message = message
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.ok = False
        self.text = ""
        self.cancelled = False
        self.taken = False

    def resolve(self, ok: bool, text: str = "") -> None:
        self.ok, self.text = ok, text
        self._done.set()

    def take(self) -> bool:
        """The loop claims the request; False if the caller already gave up."""
        with self._lock:
            if self.cancelled:
                return False
            self.taken = True
            return True

    def wait(self, timeout: float) -> bool:
        if self._done.wait(timeout):
            return True
        with self._lock:
            if not self.taken:
                # Told "not taken", the caller may retry: the loop must then skip this one.
                self.cancelled = True
                return False
        # The loop is applying it right now: the answer is moments away.
        return self._done.wait(5.0)


class ControlServer:
    def __init__(self, deliver: Callable[[PendingReply], None],
                 on_refused: Callable[[str, bytes], None] = lambda reason, raw: None,
                 path: Optional[Path] = None, adopts: bool = False, owns_directory: Optional[bool] = None):
        """``owns_directory``: remove ``path``'s directory at the close (by
        default only a private one made here)."""
        self._deliver = deliver
        # Incarnations another engine started (adopted) are made known only
        # once their process runs (accept_token): until then a call from an
        # unknown process may be theirs, and waits for the adoption too.
        self._adopts = adopts
        self._on_refused = on_refused
        self._incarnations: dict[str, Incarnation] = {}  # marker -> incarnation
        self._roots: dict[str, _Root] = {}  # marker -> root process, once started
        self._by_pid: dict[int, str] = {}  # root pid -> marker
        # Incarnations being stopped: their requests are answered at once,
        # since the loop is busy stopping them and must not be waited for.
        self._stopping: set[str] = set()
        self.idle_closed = 0  # connections closed without a whole request
        self._changed = threading.Condition()
        # Every refusal counted; a few per origin and window told through on_refused.
        self.refusals = RefusalLog(lambda origin, reason, count: self._on_refused(
            f"{count} more SDK requests of {origin} refused in the last {self.refusals.every_s:g} s "
            f"(the last: {reason})", b""))
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                admitted = self.server.admitted(self.request)
                try:
                    line = read_line(self.request, protocol.MAX_REQUEST_BYTES, IDLE_S)
                except socket.timeout:
                    server._idle(admitted.origin)
                    return
                except OSError:
                    return
                ok, text = server._handle(admitted.peer, line, admitted.origin)
                try:
                    self.request.settimeout(IDLE_S)
                    self.request.sendall(protocol.encode_response(ok, text))
                except OSError:
                    pass

        self.path = Path(path) if path is not None else private_socket_path()
        self._own_directory = path is None if owns_directory is None else owns_directory
        self.path.unlink(missing_ok=True)  # a socket left by a killed predecessor
        self._server = BoundedUnixServer(
            str(self.path), Handler, total=MAX_CONNECTIONS, origin_of=self._origin,
            cap_of=lambda origin: MAX_CALLS_PER_INCARNATION, refusals=self.refusals, on_over_cap=self._over_cap)
        self.address = str(self.path)
        self._thread = threading.Thread(target=self._server.serve_forever, name="sdk-control", daemon=True)
        self._thread.start()

    # ------------------------------------------------------- connections

    def _origin(self, conn: socket.socket) -> tuple[str, Peer]:
        """Whose a new connection is, for its limit: the incarnation of the
        calling process, or all processes of none together."""
        peer = peer_of(conn)
        found = self.attribute(peer.pid)
        if found is None:
            return UNKNOWN_ORIGIN, peer
        who = found[1]
        return f"job {who.job_id}'s instance {who.instance} (round {who.round}, start {who.start})", peer

    def _over_cap(self, conn: socket.socket, origin: str, reason: str, tell: bool) -> None:
        """A connection over a limit: told why (if it reads at once), then closed."""
        try:
            conn.setblocking(False)
            conn.send(protocol.encode_response(False, f"refused: {reason}; wait for your open SDK calls to end"))
        except OSError:
            pass
        if tell:
            self._on_refused(f"SDK connection refused: {reason}", b"")

    def _idle(self, origin: str) -> None:
        with self._changed:
            self.idle_closed += 1
        self._report(origin, f"an SDK connection of {origin} sent no whole request within {IDLE_S:g} s", b"")

    def _report(self, origin: str, reason: str, raw: bytes) -> None:
        if self.refusals.refuse(origin, reason):
            self._on_refused(reason, raw)

    @property
    def open_connections(self) -> int:
        return self._server.open

    # ------------------------------------------------------ incarnations

    def issue_token(self, incarnation: Incarnation) -> str:
        """Register an incarnation about to start; its marker for the environment."""
        token = secrets.token_urlsafe(24)
        with self._changed:
            self._incarnations[token] = incarnation
        return token

    def bind(self, token: str, pid: int) -> None:
        """The incarnation's process exists: requests from its tree are its own."""
        with self._changed:
            if token not in self._incarnations:
                return  # revoked meanwhile
            found = stat_of(pid) if pid > 0 else None
            if found is None:
                self._forget(token)  # it never ran, or already died: nothing can speak for it
            else:
                self._roots[token] = _Root(pid, found[1], uid_of(pid))
                self._by_pid[pid] = token
            self._changed.notify_all()

    def accept_token(self, token: str, incarnation: Incarnation, pid: int) -> None:
        """An incarnation another engine started, adopted here (runtime/adoption.py),
        whose root process is ``pid``."""
        with self._changed:
            self._incarnations[token] = incarnation
        self.bind(token, pid)

    def revoke(self, token: str) -> None:
        with self._changed:
            self._forget(token)
            self._changed.notify_all()

    def _forget(self, token: str) -> None:
        self._incarnations.pop(token, None)
        self._stopping.discard(token)
        root = self._roots.pop(token, None)
        if root is not None and self._by_pid.get(root.pid) == token:
            del self._by_pid[root.pid]

    def mark_stopping(self, token: str) -> None:
        """From now on this incarnation's SDK calls never wait for the loop:
        a worker leaving a hang_detect scope in its SIGTERM handler exits at
        once instead of holding its stop for the whole grace period."""
        with self._changed:
            if token in self._incarnations:
                self._stopping.add(token)

    def attribute(self, pid: int) -> Optional[tuple[str, Incarnation]]:
        """The incarnation (marker, incarnation) whose process tree holds this pid."""
        chain = list(ancestry(pid))
        with self._changed:
            for ancestor, started in chain:
                token = self._by_pid.get(ancestor)
                root = self._roots.get(token) if token else None
                if root is not None and root.started == started:
                    return token, self._incarnations[token]
        return None

    def _attribute_waiting(self, pid: int) -> Optional[tuple[str, Incarnation]]:
        """As ``attribute``, waiting a moment while some incarnation is still
        being started (or, where tasks started elsewhere are adopted, may
        be): its first call can come before its pid is bound."""
        deadline = now() + BIND_WAIT_S
        while True:
            found = self.attribute(pid)
            if found is not None:
                return found
            with self._changed:
                unbound = set(self._incarnations) - set(self._roots)
                left = deadline - now()
                if not (unbound or self._adopts) or left <= 0:
                    return None
                self._changed.wait(min(left, 0.5))

    # ---------------------------------------------------------- requests

    def _handle(self, peer: Peer, line: bytes, origin: str = UNKNOWN_ORIGIN) -> tuple[bool, str]:
        try:
            body = protocol.decode_request(line.rstrip(b"\r\n"))
        except protocol.ProtocolError as exc:
            self._report(origin, f"{exc} (from pid {peer.pid})", line[:4096])
            return False, str(exc)
        found = self._attribute_waiting(peer.pid)
        root = self._roots.get(found[0]) if found else None
        reason = ""
        if found is None:
            reason = (f"pid {peer.pid} (uid {peer.uid}) is not a process of any running incarnation; "
                      "only an instance's own processes may use its SDK")
        elif root is not None and root.uid is not None and root.uid != peer.uid:
            # A setuid program below the instance acts for someone else, not for the job.
            reason = f"pid {peer.pid} runs as uid {peer.uid}, its instance as uid {root.uid}"
        if reason:
            self._report(origin, reason, line[:4096])
            return False, reason + ": is this process still part of a running job?"
        token, who = found
        with self._changed:
            stopping = token in self._stopping
        message = SdkMessage(
            job_id=who.job_id, time=now(), instance=who.instance, round=who.round, start=who.start,
            op=SdkOp(body["op"]), content=body.get("content", ""),
            keywords=tuple(body.get("errors", ())), interval=body.get("interval"), step=body.get("step"),
        )
        if stopping and message.op is SdkOp.SET_HANG_INTERVAL:
            return True, "ignored: this instance is being stopped"
        pending = PendingReply(message)
        self._deliver(pending)
        if stopping:
            # Keywords and messages still reach the engine; the caller does not wait for it.
            return True, "accepted: this instance is being stopped"
        if not pending.wait(REPLY_WAIT_S):
            return False, "the engine did not take the message in time"
        return pending.ok, pending.text

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)
        if self._own_directory:
            shutil.rmtree(self.path.parent, ignore_errors=True)
