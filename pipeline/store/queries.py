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
from typing import Iterable, Mapping, Protocol, Sequence

import msgspec

from pipeline.store.schema import BY_NAME, Table, check, clickhouse_rows, decode_result

# ClickHouse has no "no limit" value for LIMIT; the largest UInt64 is one.
_NO_LIMIT = 2**64 - 1
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB = "({job_id:Nullable(String)} IS NULL OR job_id = {job_id:Nullable(String)})"


class Sql(Protocol):
    """A connection inside the history database (set as its current database)."""

    def execute(self, statement: str) -> None: ...

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]: ...

    def insert(self, statement: str, body: bytes) -> None:
        """Run ``statement`` (an INSERT ... FORMAT JSONEachRow) with ``body`` as its data."""


def quote_identifier(name: str) -> str:
    """A database name for DDL, which cannot take it as a query parameter."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain ClickHouse identifier (letters, digits, _)")
    return f"`{name}`"


def parse_rows(data: bytes) -> list[dict]:
    """JSONEachRow output as dicts."""
    lines = [line for line in data.splitlines() if line.strip()]
    return msgspec.json.decode(b"[" + b",".join(lines) + b"]") if lines else []


def insert_statement(table: Table) -> str:
    return f"INSERT INTO {table.name} ({', '.join(table.columns)}) FORMAT JSONEachRow"


def insert_records(sql: Sql, records: Iterable[msgspec.Struct], checked: bool = False) -> int:
    """Insert records of any of the tables, one statement per table."""
    by_table: dict[Table, list] = defaultdict(list)
    for record in records:
        table = BY_NAME[type(record).__name__] if False else None  # placeholder replaced below
        by_table[check(record) if not checked else _table(record)].append(record)
    for table, rows in by_table.items():
        sql.insert(insert_statement(table), clickhouse_rows(table, rows))
    return sum(len(rows) for rows in by_table.values())
