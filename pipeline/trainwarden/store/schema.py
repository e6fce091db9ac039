"""The Python side of the tables: which struct fills which table, and how a
record becomes a row ClickHouse parses exactly.

The column names and order are the struct's fields (records.py); the column
types are in migrations/*.sql and a test checks that both agree.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Iterable

import msgspec

from trainwarden.store.records import (
    DeadLetter,
    DeliveryRecord,
    DiagnosisRecord,
    FaultRecord,
    JobRecord,
    NodeEventRecord,
    RestartStages,
    SpotTransition,
    StackReportRecord,
    to_row,
)

EMBEDDED_DATABASE = "trainwarden"

# DateTime64's range; outside it ClickHouse would clamp silently.
_TIME_MIN = -2208988800.0  # 1900-01-01
_TIME_MAX = 10413791999.999  # 2299-12-31 23:59:59.999
_UINT32 = (0, 2**32 - 1)
_INT32 = (-(2**31), 2**31 - 1)
_INT_RANGES = {"round": _UINT32, "error_code": _INT32, "instances": _UINT32, "rounds": _UINT32,
               "processes": _UINT32, "groups": _UINT32, "rank": _INT32,
               "attempts": _UINT32, "http_status": (0, 65535),
               "preemptions": _UINT32, "resumes": _UINT32}


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    struct: type
    times: tuple[str, ...]  # DateTime64(3, 'UTC') columns, float seconds in Python

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        return self.struct.__struct_fields__

    @functools.cached_property
    def ints(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c in _INT_RANGES)

    @functools.cached_property
    def floats(self) -> tuple[str, ...]:
        hints = self.struct.__annotations__
        return tuple(c for c in self.columns if c not in self.times and hints[c] in (float, "float"))


TABLES = (
    Table("fault_records", FaultRecord, ("time", "updated_at")),
    Table("restart_stages", RestartStages,
          ("detected_at", "decided_at", "stopped_at", "restarted_at", "running_at", "updated_at")),
    Table("jobs", JobRecord, ("submitted_at", "finished_at", "updated_at")),
    Table("dead_letters", DeadLetter, ("time",)),
    Table("stack_reports", StackReportRecord, ("time", "updated_at")),
    Table("diagnoses", DiagnosisRecord, ("time", "updated_at")),
    Table("deliveries", DeliveryRecord, ("time", "updated_at")),
    Table("node_events", NodeEventRecord, ("time", "updated_at")),
    Table("spot_transitions", SpotTransition, ("time", "updated_at")),
)
BY_NAME = {t.name: t for t in TABLES}
_BY_TYPE = {t.struct: t for t in TABLES}


def table_of(record: object) -> Table:
    try:
        return _BY_TYPE[type(record)]
    except KeyError:
        kinds = ", ".join(t.struct.__name__ for t in TABLES)
        raise TypeError(f"the history stores {kinds}, not {type(record).__name__}") from None


def check(record: msgspec.Struct) -> Table:
    """Raise ValueError when the record would not round-trip through its table.

    msgspec structs do not check types on construction, and ClickHouse would
    coerce or clamp a wrong value instead of refusing it, so this is the only
    place where a bad value can be stopped before it is stored wrongly."""
    table = table_of(record)
    try:
        # The round trip the record will make: JSON in the spool, then JSON
        # into ClickHouse. It also refuses NaN (JSON null) and lone surrogates.
        msgspec.json.decode(msgspec.json.encode(record), type=type(record))
    except (TypeError, UnicodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{type(record).__name__}: {exc}") from None
    for column in table.ints:
        low, high = _INT_RANGES[column]
        value = getattr(record, column)
        if not low <= value <= high:
            raise ValueError(f"{table.struct.__name__}.{column} = {value} is outside {low}..{high}")
    for column in table.times:
        value = getattr(record, column)
        if not (math.isfinite(value) and _TIME_MIN <= value <= _TIME_MAX):
            raise ValueError(f"{table.struct.__name__}.{column} = {value} is not a time from 1900 to 2299")
    return table


def time_text(seconds: float) -> str:
    """A time as DateTime64(3)'s own text form, rounded to the millisecond.

    Text, not a number: ClickHouse reads a number as seconds or as ticks
    depending on its shape and settings, but this form only one way."""
    whole, ms = divmod(round(seconds * 1000), 1000)
    return "%04d-%02d-%02d %02d:%02d:%02d.%03d" % (time.gmtime(whole)[:6] + (ms,))


def clickhouse_rows(table: Table, records: Iterable[msgspec.Struct]) -> bytes:
    """JSONEachRow for ``INSERT INTO <table> (<columns>) FORMAT JSONEachRow``."""
    lines = []
    for record in records:
        row = to_row(record)
        for column in table.times:
            row[column] = time_text(row[column])
        lines.append(msgspec.json.encode(row))
    return b"\n".join(lines) + b"\n"


def decode_result(rows: list[dict], times: Iterable[str] = (), ints: Iterable[str] = (),
                  floats: Iterable[str] = ()) -> list[dict]:
    """Rows from a query back to Python values: ``<col>_ms`` millisecond
    integers become float seconds named ``<col>``, ints and floats get their
    Python type whatever the output format's quoting of 64-bit numbers."""
    times, ints, floats = set(times), set(ints), set(floats)
    out = []
    for row in rows:
        fixed = {}
        for key, value in row.items():
            if key.endswith("_ms") and key[:-3] in times:
                fixed[key[:-3]] = int(value) / 1000
            elif key in ints:
                fixed[key] = int(value)
            elif key in floats:
                # JSON output has no NaN: ClickHouse writes it as null.
                fixed[key] = math.nan if value is None else float(value)
            else:
                fixed[key] = value
        out.append(fixed)
    return out
