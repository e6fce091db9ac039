"""Moving spooled segments into the tables (the caller holds the store lock).

Order of effects per batch: insert, then delete the segments. A crash in
between re-inserts the batch on the next ingest, which FINAL collapses
(every table is a ReplacingMergeTree keyed on the record's identity).
A segment that cannot be read is never dropped: it moves to ``spool/bad/``
and a dead letter about it is inserted with the batch.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from trainwarden.store import queries
from trainwarden.store.records import DeadLetter
from trainwarden.store.spool import BadSegment, pending_segments, read_segment, segment_time, stale_temporaries

BATCH_BYTES = 32 * 1024 * 1024  # one INSERT per table per batch; bounds the memory of a catch-up
STALE_TEMP_S = 600.0
PAYLOAD_BYTES = 4096
SOURCE = "store.spool"


@dataclasses.dataclass
class IngestReport:
    segments: int = 0
    rows: int = 0
    bad: list[str] = dataclasses.field(default_factory=list)


def ingest(sql: queries.Sql, spool: Path) -> IngestReport:
    """Ingest the segments present now, oldest first; later ones wait for the next call."""
    report = IngestReport()
    batch: list[tuple[Path, bytes]] = []
    size = 0
    for path in pending_segments(spool):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        if batch and size + len(data) > BATCH_BYTES:
            _ingest_batch(sql, spool, batch, report)
            batch, size = [], 0
        batch.append((path, data))
        size += len(data)
    for path in stale_temporaries(spool, STALE_TEMP_S):
        try:
            batch.append((path, path.read_bytes()))
        except FileNotFoundError:
            continue
    if batch:
        _ingest_batch(sql, spool, batch, report)
    return report


def _ingest_batch(sql: queries.Sql, spool: Path, batch: list[tuple[Path, bytes]], report: IngestReport) -> None:
    records, good, bad = [], [], []
    for path, data in batch:
        try:
            if path.name.startswith("."):
                raise BadSegment("a writer stopped while writing it (temporary file left behind)")
            for rows in read_segment(data).values():
                records.extend(rows)
            good.append(path)
        except BadSegment as exc:
            bad.append(path)
            records.append(_letter(path, data, str(exc)))
    report.rows += queries.insert_records(sql, records, checked=True)
    bad_dir = spool / "bad"
    for path in bad:
        bad_dir.mkdir(exist_ok=True)
        os.replace(path, bad_dir / _bad_name(path))
        report.bad.append(path.name)
    for path in good:
        path.unlink(missing_ok=True)
    report.segments += len(batch)


def _bad_name(path: Path) -> str:
    return path.name.lstrip(".")


def _letter(path: Path, data: bytes, reason: str) -> DeadLetter:
    return DeadLetter(
        time=segment_time(path),
        source=SOURCE,
        job_id="",
        error=f"spool segment {path.name} could not be ingested ({reason}); kept as spool/bad/{_bad_name(path)}",
        payload=data[:PAYLOAD_BYTES].decode("utf-8", errors="replace"),
    )
