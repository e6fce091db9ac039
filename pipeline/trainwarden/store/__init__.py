"""The history store: one schema (migrations/), one set of queries (queries.py),
two backends.

- a directory: the embedded store. Writers append to its spool
  (``SpoolWriter``) and never wait; readers (``EmbeddedStore``) take the
  store's lock, ingest the spool into chDB and query.
- ``http://`` / ``https://user@host:port/database``: a ClickHouse server
  (``ServerStore``), reader and writer at once.

chDB and clickhouse-connect are imported only when a backend that needs them
is opened, so that a process that only writes records stays light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from trainwarden.store.base import HistoryReader, HistoryWriter, Record, StoreError, default_store_dir
from trainwarden.store.spool import SpoolWriter

__all__ = [
    "EmbeddedStore", "HistoryReader", "HistoryWriter", "Record", "ServerStore", "SpoolWriter", "StoreError",
    "default_store_dir", "open_reader", "open_writer", "register_scheme",
]


def _embedded_reader(target: str, wait_s: float) -> HistoryReader:
    from trainwarden.store.embedded import EmbeddedStore

    return EmbeddedStore(target, lock_timeout_s=wait_s)


def _server(target: str, wait_s: float) -> Any:
    from trainwarden.store.server import ServerStore

    return ServerStore(target)


# scheme -> (reader factory, writer factory); a factory takes the target and the lock wait.
_SCHEMES: dict[str, tuple[Callable[[str, float], Any], Callable[[str, float], Any]]] = {
    "http": (_server, _server),
    "https": (_server, _server),
}


def register_scheme(scheme: str, reader: Callable[[str, float], Any], writer: Callable[[str, float], Any]) -> None:
    """Make ``scheme://...`` store URLs open with these factories."""
    _SCHEMES[scheme.lower()] = (reader, writer)


def _resolve(target: str | os.PathLike | None) -> tuple[str, str | None]:
    """(target, scheme); scheme None for a directory."""
    if target is None:
        return str(default_store_dir()), None
    text = os.fspath(target)
    if "://" not in text:
        return text, None
    scheme = urlsplit(text).scheme.lower()
    if scheme == "file":
        return unquote(urlsplit(text).path), None
    if scheme not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
        raise StoreError(f"The history store {text!r} has an unknown scheme {scheme}://.",
                         hint=f"give a directory, file://, or one of {known}")
    return text, scheme


def open_reader(target: str | os.PathLike | None = None, wait_s: float = 30.0) -> HistoryReader:
    """A reader for a store directory or URL (default: ``default_store_dir()``).

    For a directory, ``wait_s`` is how long to wait for the store's lock; the
    reader holds it only during a call or a ``with`` block."""
    resolved, scheme = _resolve(target)
    if scheme is None:
        return _embedded_reader(resolved, wait_s)
    return _SCHEMES[scheme][0](resolved, wait_s)


def open_writer(target: str | os.PathLike | None = None) -> HistoryWriter:
    """A writer for a store directory (its spool: never waits) or URL."""
    resolved, scheme = _resolve(target)
    if scheme is None:
        return SpoolWriter(Path(resolved))
    return _SCHEMES[scheme][1](resolved, 0.0)


def __getattr__(name: str) -> Any:
    # The backends import chDB / clickhouse-connect; load them on first mention.
    if name == "EmbeddedStore":
        from trainwarden.store.embedded import EmbeddedStore

        return EmbeddedStore
    if name == "ServerStore":
        from trainwarden.store.server import ServerStore

        return ServerStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
