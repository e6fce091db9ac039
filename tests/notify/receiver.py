"""A real HTTP receiver in a thread, answering from a script.

Each request takes the next scripted answer (then the default): a status, a
(status, headers) pair, or HANG (accept, read, never answer until the
receiver closes). Every request is recorded with its headers and body.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = "hang"


@dataclasses.dataclass
class Received:
    at: float  # time.monotonic()
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


class Receiver:
    def __init__(self, script: list[Any] = (), default: Any = 200, body: bytes = b"ok", delay: float = 0.0):
        self.script = collections.deque(script)
        self.delay = delay  # seconds before each answer
        self.default = default
        self.answer_body = body
        self.requests: list[Received] = []
        self._cond = threading.Condition()
        self._closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet test output
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._cond:
                    receiver.requests.append(Received(time.monotonic(), self.command, self.path,
                                                      {k.lower(): v for k, v in self.headers.items()}, body))
                    action = receiver.script.popleft() if receiver.script else receiver.default
                    receiver._cond.notify_all()
                if receiver.delay:
                    time.sleep(receiver.delay)
                if action == HANG:
                    receiver._closing.wait(60)
                    self.close_connection = True
                    return
                status, headers = (action, {}) if isinstance(action, int) else action
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.answer_body)))
                self.end_headers()
                self.wfile.write(receiver.answer_body)

            do_POST = do_PUT = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def ids(self) -> list[str]:
        with self._cond:
            return [r.webhook_id for r in self.requests]

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
