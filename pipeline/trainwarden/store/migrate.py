"""Versioned schema migrations: ``migrations/NNNN_name.sql``, applied in order.

Every statement is idempotent (IF NOT EXISTS ...), so a migration that was
interrupted before it was recorded is simply run again; two processes
migrating a server at once both succeed and schema_migrations (a
ReplacingMergeTree on version) keeps one row per version.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import msgspec

from trainwarden.store.queries import Sql, quote_identifier
from trainwarden.store.schema import time_text

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE = re.compile(r"(\d{4})_[A-Za-z0-9_]+\.sql")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def split_statements(text: str) -> list[str]:
    """Statements end with ``;`` at the end of a line; ``--`` comment lines are dropped."""
    statements, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        current.append(line.rstrip())
        if stripped.endswith(";"):
            statements.append("\n".join(current).rstrip().rstrip(";").rstrip())
            current = []
    if current:
        statements.append("\n".join(current).strip())
    return statements


def load(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    migrations: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.fullmatch(path.name)
        if not match:
            raise ValueError(f"migration file {path.name} is not named NNNN_name.sql")
        version = int(match.group(1))
        if version in migrations:
            raise ValueError(f"migrations {migrations[version].name} and {path.name} share version {version}")
        migrations[version] = Migration(version, path.name, tuple(split_statements(path.read_text("utf-8"))))
    return [migrations[v] for v in sorted(migrations)]


def create_database(sql: Sql, name: str) -> None:
    sql.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(name)}")


def applied_versions(sql: Sql) -> list[int]:
    exists = sql.select("SELECT count() AS n FROM system.tables"
                        " WHERE database = currentDatabase() AND name = 'schema_migrations'")
    if not int(exists[0]["n"]):
        return []
    rows = sql.select("SELECT DISTINCT version FROM schema_migrations ORDER BY version")
    return [int(row["version"]) for row in rows]


def current_version(sql: Sql) -> int:
    """The highest applied migration; 0 for an empty database."""
    versions = applied_versions(sql)
    return versions[-1] if versions else 0


def apply(sql: Sql, migrations: list[Migration] | None = None) -> list[int]:
    """Apply the pending migrations in version order; returns the versions applied."""
    migrations = load() if migrations is None else migrations
    done = set(applied_versions(sql))
    applied = []
    for migration in migrations:
        if migration.version in done:
            continue
        for statement in migration.statements:
            sql.execute(statement)
        row = {"version": migration.version, "applied_at": time_text(time.time())}
        sql.insert("INSERT INTO schema_migrations (version, applied_at) FORMAT JSONEachRow",
                   msgspec.json.encode(row) + b"\n")
        applied.append(migration.version)
    return applied

