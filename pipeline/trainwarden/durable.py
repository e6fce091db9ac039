"""State that survives a crash or a power cut: the few lines of file I/O the
history spool and the notification queue share, and where their state lives."""

from __future__ import annotations

import os
from pathlib import Path


def write_synced(path: str | os.PathLike, data: bytes, flags: int, mode: int = 0o600) -> None:
    """Open with ``flags`` (plus O_WRONLY), write all of ``data`` and fsync before closing."""
    fd = os.open(path, os.O_WRONLY | flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str | os.PathLike) -> None:
    """Makes a rename or a new file in ``path`` itself durable."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def state_directory(name: str, override_env: str) -> Path:
    """``$override_env``, else ``name`` in the XDG state directory: history and
    queued notifications are state (losing them loses information), not cache."""
    explicit = os.environ.get(override_env)
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME")
    # XDG says relative values are invalid and must be ignored.
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "trainwarden" / name
