"""The C4D diagnostic channel: a log file written by the C4D agent on a node.

Followed like ``tail -F``: new lines as they are written, from the end of
the file at start (what C4D said before this run is not about it), across
truncation and replacement by a new file of the same name.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

POLL_S = 0.2
MAX_LINE = 64 * 1024


class FileFollower:
    def __init__(self, path: Path, on_line: Callable[[str], None], from_start: bool = False):
        self.path = Path(path)
        self.on_line = on_line
        self.lines = 0
        self._stop = threading.Event()
        self._position = 0 if from_start else self._size()
        self._inode = self._stat_inode()
        self._buffer = b""
        self._thread = threading.Thread(target=self._loop, name=f"follow-{self.path.name}", daemon=True)
        self._thread.start()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def _stat_inode(self) -> int:
        try:
            return self.path.stat().st_ino
        except OSError:
            return -1

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        inode, size = self._stat_inode(), self._size()
        if inode != self._inode or size < self._position:
            self._inode, self._position, self._buffer = inode, 0, b""  # replaced or truncated
        if size <= self._position:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._position)
                chunk = handle.read(size - self._position)
        except OSError:
            return
        self._position += len(chunk)
        data = self._buffer + chunk
        *complete, self._buffer = data.split(b"\n")
        if len(self._buffer) > MAX_LINE:
            self._buffer = b""  # a runaway line is not a diagnosis
        for raw in complete:
            self.lines += 1
            self.on_line(raw.decode("utf-8", errors="replace").rstrip("\r"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.poll()
