"""Every SQL statement that reads or writes history, for both backends.

A backend only provides a connection (``Sql``) that runs a statement with
named ``{name:Type}`` parameters and returns JSONEachRow rows; chDB and a
ClickHouse server then run the very same text. User data never goes into the
SQL text: values are query parameters, rows are JSONEachRow data after
``FORMAT``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable, Mapping, Protocol

import msgspec

from trainwarden.store import analytics
from trainwarden.store.schema import BY_NAME, Table, check, clickhouse_rows, decode_result, table_of

# ClickHouse has no "no limit" value for LIMIT; the largest UInt64 is one.
_NO_LIMIT = 2**64 - 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB = "({job_id:Nullable(String)} IS NULL OR job_id = {job_id:Nullable(String)})"

FAULTS = BY_NAME["fault_records"]
STAGES = BY_NAME["restart_stages"]
JOBS = BY_NAME["jobs"]
LETTERS = BY_NAME["dead_letters"]
SPOT = BY_NAME["spot_transitions"]


class Sql(Protocol):
    """A connection whose current database is the history database."""

    def execute(self, statement: str) -> None: ...

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]: ...

    def insert(self, statement: str, body: bytes) -> None:
        """Run ``statement`` (an INSERT ... FORMAT JSONEachRow) with ``body`` as its data."""


def quote_identifier(name: str) -> str:
    """A database name for DDL, which cannot take it as a query parameter."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain ClickHouse identifier (letters, digits and _)")
    return f"`{name}`"


# ClickHouse's escaped text format, the form the query-parameter protocol takes
# values in (chDB passes them through raw; clickhouse-connect escapes its own).
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0",
                          "\b": "\\b", "\f": "\\f", "'": "\\'"})


def param_text(value: object) -> str:
    """A query parameter value as protocol text: None is NULL, strings escaped."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value.translate(_ESCAPES)
    raise TypeError(f"no query parameter form for {type(value).__name__}")


def parse_rows(data: bytes) -> list[dict]:
    """JSONEachRow output as dicts."""
    lines = [line for line in data.splitlines() if line.strip()]
    return msgspec.json.decode(b"[" + b",".join(lines) + b"]") if lines else []


def insert_statement(table: Table) -> str:
    return f"INSERT INTO {table.name} ({', '.join(table.columns)}) FORMAT JSONEachRow"


def insert_records(sql: Sql, records: Iterable[msgspec.Struct], checked: bool = False) -> int:
    """Insert records of any of the tables, one statement per table; returns the count.

    Unless ``checked``, every record is validated first so that nothing is
    inserted when one of them is wrong."""
    by_table: dict[Table, list] = defaultdict(list)
    for record in records:
        by_table[table_of(record) if checked else check(record)].append(record)
    for table, rows in by_table.items():
        sql.insert(insert_statement(table), clickhouse_rows(table, rows))
    return sum(len(rows) for rows in by_table.values())


def _columns(table: Table) -> str:
    # Times leave as integer milliseconds: exact in JSON, unlike a float or a
    # formatted string, whatever the output settings.
    return ", ".join(f"toUnixTimestamp64Milli({c}) AS {c}_ms" if c in table.times else c
                     for c in table.columns)


def _newest(table: Table, order: str, where: str = "1") -> str:
    """The newest ``limit`` rows of ``table`` (FINAL: one per key), oldest first."""
    descending = ", ".join(f"{c} DESC" for c in order.split(", "))
    ascending = ", ".join(f"{c}_ms" if c in table.times else c for c in order.split(", "))
    return (f"SELECT * FROM (SELECT {_columns(table)} FROM {table.name} FINAL WHERE {where}"
            f" ORDER BY {descending} LIMIT {{limit:UInt64}}) ORDER BY {ascending}")


JOBS_SQL = _newest(JOBS, "submitted_at, job_id", _JOB)
LETTERS_SQL = _newest(LETTERS, "time, source, job_id")
STAGES_SQL = (f"SELECT {_columns(STAGES)} FROM restart_stages FINAL WHERE {_JOB}"
              " ORDER BY detected_at, record_id, instance_name")


def _limit(limit: int | None) -> int:
    if limit is None:
        return _NO_LIMIT
    if limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    return limit


def _decode(table: Table, rows: list[dict]) -> list[dict]:
    return decode_result(rows, table.times, table.ints, table.floats)


def faults(sql: Sql, job_id: str | None = None, limit: int | None = None) -> list[dict]:
    """The newest version of each fault record, ordered by time and record_id;
    with a limit, the last ``limit`` of them. (The query is the dashboards'
    fault list: analytics.py.)"""
    return analytics.run(sql, "fault_list", job=job_id, limit=_limit(limit))


def aggregate(sql: Sql, job_id: str | None = None) -> list[dict]:
    """Fault records grouped by source, code, signature, node and instance; most frequent first."""
    return analytics.run(sql, "fault_details", job=job_id)


def restart_stages(sql: Sql, job_id: str | None = None) -> list[dict]:
    return _decode(STAGES, sql.select(STAGES_SQL, {"job_id": job_id}))


def jobs(sql: Sql, job_id: str | None = None, limit: int | None = None) -> list[dict]:
    """Jobs by submission time; with a limit, the most recently submitted."""
    return _decode(JOBS, sql.select(JOBS_SQL, {"job_id": job_id, "limit": _limit(limit)}))


def dead_letters(sql: Sql, limit: int = 100) -> list[dict]:
    """The newest ``limit`` dead letters, oldest first."""
    return _decode(LETTERS, sql.select(LETTERS_SQL, {"limit": _limit(limit)}))


def optimize(sql: Sql) -> list[str]:
    """Merge every table's parts and collapse record versions now (OPTIMIZE ...
    FINAL), so that reads with FINAL find one part per partition and have no
    merging left to do. The embedded store opens chDB only briefly, so its
    background merges rarely finish on their own; run this after large
    catch-ups (`trainwarden store optimize`). Returns the tables merged."""
    names = [t.name for t in BY_NAME.values()]
    for name in names:
        sql.execute(f"OPTIMIZE TABLE {quote_identifier(name)} FINAL")
    return names


DELIVERIES = BY_NAME["deliveries"]
DELIVERIES_SQL = _newest(DELIVERIES, "time, delivery_id", _JOB)


def deliveries(sql: Sql, job_id: str | None = None, limit: int | None = None) -> list[dict]:
    """The newest version of each notification delivery, oldest event first."""
    return _decode(DELIVERIES, sql.select(DELIVERIES_SQL, {"job_id": job_id, "limit": _limit(limit)}))


SPOT_SQL = (f"SELECT {_columns(SPOT)} FROM spot_transitions FINAL WHERE {_JOB}"
            " ORDER BY job_id, time, updated_at, record_id")


def spot_transitions(sql: Sql, job_id: str | None = None) -> list[dict]:
    """Spot jobs' lifecycle steps with the cost so far, in order per job."""
    return _decode(SPOT, sql.select(SPOT_SQL, {"job_id": job_id}))


def job_costs(sql: Sql, job_id: str | None = None) -> list[dict]:
    """Per spot job: state, preemptions, resumes, seconds queued and held,
    what it paid and what on-demand would have cost, the share saved; in
    order of first appearance. The dashboards' and the report's query."""
    rows = analytics.run(sql, "spot_costs", job=job_id)
    return sorted(rows, key=lambda r: (r["first_time"], r["job_id"]))
