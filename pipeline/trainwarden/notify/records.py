"""The delivery log: one row per (event, subscription), newest version wins.

``DeliveryRecord`` is written through any object with ``write(records)``.
Until the history store has a deliveries table, the notifier's own JSONL file
(``JsonlDeliveryLog``, ``NOTIFY_DIR/deliveries.jsonl``) is what
``trainwarden notify log`` reads. Records never hold a URL, a header or a
secret: only names, ids, counts and a redacted, bounded error text.
"""

from __future__ import annotations

import enum
import os
import threading
from pathlib import Path
from typing import Optional, Protocol, Sequence

import msgspec

from trainwarden.durable import write_synced
from trainwarden.store.records import DeliveryRecord


class DeliveryStatus(str, enum.Enum):
    DELIVERED = "delivered"  # the receiver answered 2xx
    RETRYING = "retrying"  # an attempt failed; another is scheduled
    DEAD = "dead"  # no further attempt: a 4xx, the last attempt failed, refused target, queue full
    SUPPRESSED = "suppressed"  # rate limited; the latest of a window is sent at the window's end
    DISABLED = "disabled"  # the endpoint answered 410 Gone: the subscription is off


class DeliveryWriter(Protocol):
    def write(self, records: Sequence[DeliveryRecord]) -> None: ...


class MemoryDeliveryLog:
    """Keeps every version in memory (tests, and the embedded run's summary)."""

    def __init__(self) -> None:
        self.records: list[DeliveryRecord] = []
        self._lock = threading.Lock()

    def write(self, records: Sequence[DeliveryRecord]) -> None:
        with self._lock:
            self.records.extend(records)

    def latest(self) -> list[DeliveryRecord]:
        with self._lock:
            return newest(self.records)


class JsonlDeliveryLog:
    """Appends records as JSON lines, fsync'd; rotates once to ``.1`` past
    ``max_bytes`` so a long-lived notifier's log stays bounded."""

    def __init__(self, path: str | os.PathLike, max_bytes: int = 64 * 1024 * 1024):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def write(self, records: Sequence[DeliveryRecord]) -> None:
        if not records:
            return
        data = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.path.stat().st_size + len(data) > self.max_bytes:
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            except FileNotFoundError:
                pass
            write_synced(self.path, data, os.O_CREAT | os.O_APPEND)

    def close(self) -> None:
        """No file stays open between writes."""


def read_delivery_log(path: str | os.PathLike, job_id: Optional[str] = None,
                      limit: Optional[int] = None) -> list[DeliveryRecord]:
    """The newest version of each delivery, oldest event first. A line being
    written while we read (or cut by a crash) is skipped, not an error."""
    path = Path(path)
    records = []
    for candidate in (path.with_name(path.name + ".1"), path):
        try:
            data = candidate.read_bytes()
        except FileNotFoundError:
            continue
        for line in data.splitlines():
            try:
                record = msgspec.json.decode(line, type=DeliveryRecord)
            except msgspec.DecodeError:
                continue
            if job_id is None or record.job_id == job_id:
                records.append(record)
    result = newest(records)
    return result[-limit:] if limit else result


def newest(records: Sequence[DeliveryRecord]) -> list[DeliveryRecord]:
    latest: dict[str, DeliveryRecord] = {}
    for record in records:
        seen = latest.get(record.delivery_id)
        if seen is None or record.updated_at >= seen.updated_at:
            latest[record.delivery_id] = record
    return sorted(latest.values(), key=lambda r: (r.time, r.updated_at))
