"""Trainwarden's SDK for training code, shaped like the managed service's:

    from trainwarden.sdk import job_monitor as jm
    monitor = jm.Monitor(config=jm.PyTorchConfig())
    st = monitor.send_custom_message(content="The training loss of the job is NaN.")
    if not st.ok():
        print(st.to_string())
    monitor.set_retryable_errors(["connect timeout", "error_yyy"])
    monitor.reset_config(job_hang_interval=10)
    monitor.report_progress(step)   # how far the job got: a restart that gets no further is a crash loop

    @jm.hang_detect(180)   # this function's scope only
    def train(): ...

A call returns once the engine has taken the message into account (or with a
failed status). Without an engine (a script run by hand) every call does
nothing and says so; no call raises or blocks for more than a few seconds.
The engine knows which instance calls from the calling process itself (see
sdk/protocol.py): there is nothing to configure. Standard library only.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional

from trainwarden.sdk import protocol

CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 30.0
# During interpreter exit nothing is worth waiting for.
EXITING_TIMEOUT_S = 1.0


class Status:
    def __init__(self, ok: bool, message: str = ""):
        self._ok = ok
        self._message = message

    def ok(self) -> bool:
        return self._ok

    def to_string(self) -> str:
        return ("OK" if self._ok else "ERROR") + (f": {self._message}" if self._message else "")

    def __repr__(self) -> str:
        return f"Status({self.to_string()!r})"


class _Config:
    framework = "generic"

    def __init__(self, **params: Any):
        self.params = dict(params)


class PyTorchConfig(_Config):
    framework = "pytorch"


class TFConfig(_Config):
    framework = "tensorflow"


class Monitor:
    def __init__(self, config: Optional[_Config] = None):
        self.config = config or PyTorchConfig()
        self.address = endpoint()
        self.last_status = Status(True)
        if self.config.params:
            self.last_status = self.reset_config(**self.config.params)

    # ----------------------------------------------------------- the API

    def send_custom_message(self, content: str) -> Status:
        if not isinstance(content, str) or not content:
            return Status(False, "content must be a non-empty string")
        return self._call("custom_message", content=content[: protocol.MAX_CONTENT_CHARS])

    def set_retryable_errors(self, errors: Iterable[str]) -> Status:
        if isinstance(errors, str):
            errors = [errors]
        keywords = [e for e in errors if isinstance(e, str) and e.strip()]
        if not keywords:
            return Status(False, "errors must be a list of non-empty strings")
        return self._call("set_retryable_errors", errors=keywords)

    def report_progress(self, step: int) -> Status:
        """Says how far the job got (a step, an iteration, the number of the
        last checkpoint saved). A restart after which the job reports no
        higher step before failing again made no progress; after
        --max-num-of-no-progress-restart of those in a row the job fails."""
        try:
            step = protocol.check_step(step)
        except protocol.ProtocolError as exc:
            return Status(False, str(exc))
        return self._call("report_progress", step=step)

    def reset_config(self, params: Optional[dict] = None, **kwargs: Any) -> Status:
        merged = dict(params or {})
        merged.update(kwargs)
        try:
            present, interval = protocol.interval_from_config(merged)
        except protocol.ProtocolError as exc:
            return Status(False, str(exc))
        if not present:
            return Status(True, "nothing to change")
        return _set_interval(self, interval)

    # --------------------------------------------------------- transport

    def _call(self, op: str, **fields: Any) -> Status:
        if not self.address:
            return Status(False, "no Trainwarden engine (TRAINWARDEN_SDK_SOCKET is not set); nothing was sent")
        try:
            request = protocol.encode_request(op, **fields)
            exiting = sys.is_finalizing()
            with _connected(self.address, EXITING_TIMEOUT_S if exiting else CONNECT_TIMEOUT_S) as conn:
                conn.settimeout(EXITING_TIMEOUT_S if exiting else REPLY_TIMEOUT_S)
                conn.sendall(request)
                reply = _read_line(conn)
        except (OSError, ValueError, protocol.ProtocolError) as exc:
            return Status(False, f"the Trainwarden engine at {self.address} did not answer: {exc}")
        try:
            body = json.loads(reply)
        except ValueError:
            return Status(False, "the Trainwarden engine sent an unreadable answer")
        if body.get("ok"):
            return Status(True, str(body.get("detail", "")))
        return Status(False, str(body.get("error", "refused")))


def endpoint() -> str:
    """The engine's socket path, or "" without an engine."""
    return os.environ.get("TRAINWARDEN_SDK_SOCKET", "")


def _connected(address: str, timeout_s: float) -> socket.socket:
    """A connection to the endpoint. A full accept backlog (another process
    floods the endpoint, which refuses the flood at once) is waited out for
    up to ``timeout_s`` rather than taken for an absent engine."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout_s)
        try:
            conn.connect(address)
            return conn
        except BlockingIOError:
            conn.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
        except BaseException:
            conn.close()
            raise


def _read_line(conn: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = conn.recv(4096)
        if not chunk:
            break
        chunks.append(chunk)
        if b"\n" in chunk:
            break
    return b"".join(chunks).split(b"\n", 1)[0]


# ------------------------------------------------ staged hang detection

_lock = threading.Lock()
# The interval this process asked for: None = the job's configured one.
_current_interval: Optional[int] = None
_default_monitor: Optional[Monitor] = None


def _monitor() -> Monitor:
    global _default_monitor
    if _default_monitor is None:
        _default_monitor = Monitor()
    return _default_monitor


def _set_interval(monitor: Monitor, interval: Optional[int]) -> Status:
    global _current_interval
    _current_interval = interval
    return monitor._call("set_hang_interval", interval=interval)


def hang_detect(interval: int, monitor: Optional[Monitor] = None) -> Callable:
    """Run the decorated function with its own hang interval (-1: off); the
    previous interval comes back when it returns or raises. An invalid
    interval leaves the function as it is, with a warning: the SDK never
    breaks the training script it is imported into."""
    try:
        interval = protocol.check_interval(interval)
    except protocol.ProtocolError as exc:
        sys.stderr.write(f"trainwarden sdk: hang_detect ignored: {exc}\n")
        return lambda func: func

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            target = monitor or _monitor()
            with _lock:
                previous = _current_interval
                _set_interval(target, interval)
            try:
                return func(*args, **kwargs)
            finally:
                with _lock:
                    _set_interval(target, previous)

        return wrapper

    return decorate
