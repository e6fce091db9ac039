"""The spool: how writers hand records to the store without opening it.

chDB locks its data directory, so a job that runs for hours cannot keep it
open without locking out ``trainwarden history``. Writers instead drop one
segment file per ``write`` call into ``DIR/spool/``; whoever opens the store
next moves them into the tables (ingest.py).

A segment is JSON lines ``{"table": <table>, "row": {<record>}}``. It is
written under a hidden temporary name, fsync'd and renamed, so a segment
name ending in ``.jsonl`` is always complete. Names sort by creation time:
``<time_ns>-<pid>-<seq>.jsonl``.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Sequence

import msgspec

from trainwarden.durable import fsync_directory, write_synced

from trainwarden.store.base import Record, StoreError
from trainwarden.store.schema import BY_NAME, Table, check

SEGMENT_SUFFIX = ".jsonl"
TEMP_SUFFIX = ".tmp"
# A complete segment no reader ingests: published only if its writer dies
# first (the epitaph of a run, runtime/keeper.py publishes it).
HELD_SUFFIX = ".held"


class _Line(msgspec.Struct):
    table: str
    row: msgspec.Raw


class BadSegment(ValueError):
    """A segment that cannot be ingested; the message says why."""


class SpoolWriter:
    """Appends records to a store's spool. Never blocks on the store's lock;
    safe to share between threads and to use in forked children."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.spool = self.directory / "spool"
        # next() on a count is atomic under the GIL; unlike a lock it cannot be
        # inherited held by a forked child.
        self._seq = itertools.count(1)

    def write(self, records: Sequence[Record]) -> None:
        if not records:
            return
        self._commit(self._encode(records), len(records))

    def hold(self, records: Sequence[Record], name: str) -> Path:
        """``records`` as a held segment ``.NAME.held`` (replacing the one
        before): complete and durable, but in the history only once
        published, which the keeper does when this process dies."""
        path = self.spool / f".{name}{HELD_SUFFIX}"
        temp = self.spool / f".{name}{TEMP_SUFFIX}"
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            write_synced(temp, self._encode(records), os.O_CREAT | os.O_TRUNC, 0o644)
            os.replace(temp, path)
        except OSError as exc:
            raise self._unusable(temp, f"hold {len(records)} records", exc) from exc
        return path

    def _encode(self, records: Sequence[Record]) -> bytes:
        lines = []
        for record in records:
            try:
                table = check(record)
            except (TypeError, ValueError) as exc:
                raise StoreError(f"Nothing was written to the history: {exc}.",
                                 hint="this is a bug in the code that built the record") from None
            lines.append(msgspec.json.encode({"table": table.name, "row": record}))
        return b"\n".join(lines) + b"\n"

    def close(self) -> None:
        """Nothing to release: no file stays open between writes."""

    def _commit(self, data: bytes, count: int) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):09d}"
        temp = self.spool / f".{name}{TEMP_SUFFIX}"
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            write_synced(temp, data, os.O_CREAT | os.O_EXCL, 0o644)
            os.rename(temp, self.spool / f"{name}{SEGMENT_SUFFIX}")
            fsync_directory(self.spool)  # makes the rename itself survive a power cut
        except OSError as exc:
            raise self._unusable(temp, f"take {count} records", exc) from exc

    def _unusable(self, temp: Path, what: str, exc: OSError) -> StoreError:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass  # the spool itself is unusable; the error says so
        return StoreError(f"The history spool {self.spool} could not {what}: {exc.strerror or exc}.",
                          hint="check the free space and the permissions of the store directory")


def pending_segments(spool: Path) -> list[Path]:
    """Complete segments, oldest first."""
    try:
        names = os.listdir(spool)
    except FileNotFoundError:
        return []
    return [spool / n for n in sorted(names) if n.endswith(SEGMENT_SUFFIX) and not n.startswith(".")]


def stale_temporaries(spool: Path, older_than_s: float) -> list[Path]:
    """Temporary files left by writers that died mid-write (a write takes milliseconds)."""
    try:
        names = os.listdir(spool)
    except FileNotFoundError:
        return []
    limit = time.time() - older_than_s
    stale = []
    for name in sorted(names):
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            path = spool / name
            try:
                if path.stat().st_mtime < limit:
                    stale.append(path)
            except FileNotFoundError:
                continue  # its writer just finished it
    return stale


def read_segment(data: bytes) -> dict[Table, list[Record]]:
    """The records of a segment by table; BadSegment when any line is wrong,
    so that a segment is ingested whole or not at all."""
    by_table: dict[Table, list[Record]] = {}
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            envelope = msgspec.json.decode(line, type=_Line)
            table = BY_NAME.get(envelope.table)
            if table is None:
                raise BadSegment(f"line {number}: unknown table {envelope.table!r}")
            record = msgspec.json.decode(envelope.row, type=table.struct)
            check(record)
        except (msgspec.DecodeError, ValueError) as exc:
            # msgspec.ValidationError and BadSegment are ValueErrors too.
            raise BadSegment(str(exc) if isinstance(exc, BadSegment) else f"line {number}: {exc}") from None
        by_table.setdefault(table, []).append(record)
    return by_table


def segment_time(path: Path) -> float:
    """When the segment was written: from its name, else its modification time.
    Stable across retries, so a dead letter about it is the same row each time."""
    stem = path.name.lstrip(".").split("-", 1)[0]
    if stem.isdigit() and len(stem) >= 19:
        return round(int(stem) / 1e9, 3)
    try:
        return round(path.stat().st_mtime, 3)
    except OSError:
        return 0.0
