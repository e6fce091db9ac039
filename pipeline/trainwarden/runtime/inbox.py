"""The run's inbox: a FIFO with a bound for output lines only.

Output lines wait for room (so a flooding job feels back-pressure through its
pipe instead of growing our memory); starts, exits and SDK requests are never
refused, so they cannot be stuck behind a flood. FIFO order is kept for
everything, so an instance's exit still comes after its lines.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Optional

DEFAULT_MAX_LINES = 20_000


class Inbox:
    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, wake_on_lines: bool = True):
        """``wake_on_lines=False``: a line does not wake a ``get`` waiting
        (its caller's own timeout picks it up), so that a loop which ships
        lines in batches anyway turns once per batch, not once per line."""
        self.max_lines = max_lines
        self.wake_on_lines = wake_on_lines
        self._items: collections.deque = collections.deque()
        self._lines = 0
        self._cond = threading.Condition()

    def put(self, item: Any) -> None:
        """Always accepted (starts, exits, SDK requests)."""
        with self._cond:
            self._items.append((False, item))
            self._cond.notify_all()

    def offer_line(self, item: Any, timeout_s: float) -> bool:
        """Queue an output line, waiting up to timeout_s for room."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._lines >= self.max_lines:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._items.append((True, item))
            self._lines += 1
            if self.wake_on_lines:
                self._cond.notify_all()
            return True

    def get(self, timeout_s: float) -> Optional[Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._items:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            is_line, item = self._items.popleft()
            if is_line:
                self._lines -= 1
                self._cond.notify_all()
            return item

    def oldest_time(self) -> Optional[float]:
        """The time stamp of the oldest item waiting, if any: timers must not
        judge silence past it, since its evidence has not been read yet."""
        with self._cond:
            if not self._items:
                return None
            item = self._items[0][1]
        message = getattr(item, "message", item)
        return getattr(message, "time", None)

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
