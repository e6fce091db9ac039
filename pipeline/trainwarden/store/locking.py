"""The store lock: an flock on ``DIR/store.lock``, taken with a timeout.

chDB's own lock on its data directory fails at once instead of waiting, so
processes queue on this lock before opening chDB. The kernel releases an
flock when its holder dies, so a crashed process never leaves the store locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from trainwarden.store.base import StoreError


def acquire(path: Path, timeout_s: float, store: Path, waited_s: float | None = None) -> int:
    """Lock ``path``; returns the descriptor to give to ``release``. ``waited_s``
    is the whole wait to report when the caller already waited before calling."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreError(f"The history store {store} cannot be locked: {exc.strerror or exc}.",
                         hint="check the permissions of the store directory") from exc
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                holder = _holder(fd)
                os.close(fd)
                raise StoreError(
                    f"The history store {store} is busy (locked by another trainwarden process"
                    f" for more than {timeout_s if waited_s is None else waited_s:g} s).",
                    hint=(f"process {holder} holds {path}; " if holder else "")
                    + "wait for it to finish and try again, or stop it if it hangs") from None
            # Polling: flock has no timeout and a blocking call cannot be interrupted portably.
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.1)
    # Only for the busy message above; the lock itself is the flock.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return ""
