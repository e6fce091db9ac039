"""The SDK's endpoint on this machine: a loopback TCP server.

Each started incarnation gets its own random token; a request with an unknown
token is refused. A valid request becomes an SdkMessage handed to the service
loop together with a reply slot; the answer is sent only once the loop has
stepped the engine with it, so a keyword set just before a crash is always
known when that crash is judged.
"""

from __future__ import annotations

import dataclasses
import secrets
import socketserver
import threading
from typing import Callable, Optional

from trainwarden.events import SdkMessage, SdkOp
from trainwarden.runtime.clock import now
from trainwarden.sdk import protocol

# Longer than a restart's stop grace, so an SDK call made while the loop is
# stopping instances is still taken; the SDK client waits a little longer.
REPLY_WAIT_S = 25.0


@dataclasses.dataclass(frozen=True)
class Incarnation:
    job_id: str
    instance: str
    round: int
    start: int


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
                 host: str = "127.0.0.1"):
        self._deliver = deliver
        self._on_refused = on_refused
        self._tokens: dict[str, Incarnation] = {}
        # Incarnations being stopped: their requests are answered at once,
        # since the loop is busy stopping them and must not be waited for.
        self._stopping: set[str] = set()
        self._lock = threading.Lock()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 10

            def handle(self) -> None:
                try:
                    line = self.rfile.readline(protocol.MAX_REQUEST_BYTES + 1)
                except OSError:
                    return
                ok, text = server._handle(line)
                try:
                    self.wfile.write(protocol.encode_response(ok, text))
                except OSError:
                    pass

        socketserver.ThreadingTCPServer.daemon_threads = True
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((host, 0), Handler)
        self.address = "%s:%d" % self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="sdk-control", daemon=True)
        self._thread.start()

    def issue_token(self, incarnation: Incarnation) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = incarnation
        return token

    def accept_token(self, token: str, incarnation: Incarnation) -> None:
        """A token issued elsewhere (the actuator, for a Slurm task) that this
        endpoint now takes for that incarnation."""
        with self._lock:
            self._tokens[token] = incarnation

    def revoke(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)
            self._stopping.discard(token)

    def mark_stopping(self, token: str) -> None:
        """From now on this incarnation's SDK calls never wait for the loop:
        a worker leaving a hang_detect scope in its SIGTERM handler exits at
        once instead of holding its stop for the whole grace period."""
        with self._lock:
            if token in self._tokens:
                self._stopping.add(token)

    def _handle(self, line: bytes) -> tuple[bool, str]:
        try:
            body = protocol.decode_request(line.rstrip(b"\r\n"))
        except protocol.ProtocolError as exc:
            self._on_refused(str(exc), line[:4096])
            return False, str(exc)
        with self._lock:
            who: Optional[Incarnation] = self._tokens.get(body["token"])
            stopping = body["token"] in self._stopping
        if who is None:
            self._on_refused("unknown or expired token", b"")
            return False, "unknown or expired token: is this process still part of a running job?"
        message = SdkMessage(
            job_id=who.job_id, time=now(), instance=who.instance, round=who.round, start=who.start,
            op=SdkOp(body["op"]), content=body.get("content", ""),
            keywords=tuple(body.get("errors", ())), interval=body.get("interval"),
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
