"""The history on a ClickHouse server, through clickhouse-connect.

Same migrations and same SQL (queries.py) as the embedded store; there is no
spool and no lock, the server takes concurrent readers and writers itself.
URL: ``http[s]://user@host[:port][/database]``; the password comes from
$TRAINWARDEN_CLICKHOUSE_PASSWORD so that it never shows in a process list or
a shell history.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlsplit

from trainwarden.store import migrate, queries
from trainwarden.store.base import Record, StoreError
from trainwarden.store.schema import EMBEDDED_DATABASE

PASSWORD_ENV = "TRAINWARDEN_CLICKHOUSE_PASSWORD"


def _clickhouse_connect():
    # Imported on first use: `pip install trainwarden` (the embedded store) has no ClickHouse client.
    try:
        import clickhouse_connect
    except ImportError:
        raise StoreError("a ClickHouse --store URL needs the clickhouse-connect client, which is not installed.",
                         hint="pip install 'trainwarden[clickhouse]'") from None
    return clickhouse_connect


def _hint(url: str) -> str:
    return f"check that the ClickHouse server at {url} is up, and the user and ${PASSWORD_ENV}"


class _ConnectSql:
    def __init__(self, client: Any, url: str):
        self._client = client
        self._url = url

    def _call(self, what: str, fn, *args, **kwargs):
        from clickhouse_connect.driver.exceptions import ClickHouseError

        try:
            return fn(*args, **kwargs)
        except ClickHouseError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"The history store {self._url} failed to {what}: {first}", hint=_hint(self._url)
                             ) from exc

    def execute(self, statement: str) -> None:
        self._call("run a statement", self._client.command, statement)

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]:
        data = self._call("run a query", self._client.raw_query, query, parameters=dict(params or {}),
                          fmt="JSONEachRow")
        return queries.parse_rows(data)

    def insert(self, statement: str, body: bytes) -> None:
        self._call("insert", self._client.command, statement, data=body)


def parse_url(url: str) -> dict:
    """clickhouse-connect arguments from a store URL (without the password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(f"{url!r} is not a ClickHouse server URL.", hint="use http[s]://user@host:port/database")
    if parts.password is not None:
        raise StoreError("The ClickHouse URL contains a password.",
                         hint=f"remove it from the URL and put it in ${PASSWORD_ENV}")
    database = unquote(parts.path.strip("/")) or EMBEDDED_DATABASE
    try:
        queries.quote_identifier(database)
        port = parts.port
    except ValueError as exc:
        raise StoreError(f"The ClickHouse URL {url!r} is not valid: {exc}.",
                         hint="use http[s]://user@host:port/database") from None
    secure = parts.scheme == "https"
    return {"host": parts.hostname, "port": port or (8443 if secure else 8123), "secure": secure,
            "username": unquote(parts.username) if parts.username else None, "database": database}


class ServerStore:
    """HistoryReader and HistoryWriter on a ClickHouse server.

    Connects (and migrates) on first use. ``client`` may be an existing
    clickhouse-connect client, in which case ``url`` only names it in messages."""

    def __init__(self, url: str, client: Any = None, database: str | None = None):
        self.url = url
        self._options = parse_url(url) if client is None else {"database": database or EMBEDDED_DATABASE}
        self.database: str = self._options["database"]
        self._client = client
        self._own_client = client is None  # a borrowed client cannot be made again once closed
        self._sql: _ConnectSql | None = None
        self._ready = threading.Lock()
        self.migrated: list[int] = []  # versions this instance applied

    def __enter__(self) -> "ServerStore":
        self._connection()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._ready:
            if self._client is not None:
                self._client.close()
            self._client = self._sql = None

    def faults(self, job_id: str | None = None, limit: int | None = None) -> list[dict]:
        return queries.faults(self._connection(), job_id, limit)

    def aggregate(self, job_id: str | None = None) -> list[dict]:
        return queries.aggregate(self._connection(), job_id)

    def restart_stages(self, job_id: str | None = None) -> list[dict]:
        return queries.restart_stages(self._connection(), job_id)

    def jobs(self, job_id: str | None = None, limit: int | None = None) -> list[dict]:
        return queries.jobs(self._connection(), job_id, limit)

    def dead_letters(self, limit: int = 100) -> list[dict]:
        return queries.dead_letters(self._connection(), limit)

    def spot_transitions(self, job_id: str | None = None) -> list[dict]:
        return queries.spot_transitions(self._connection(), job_id)

    def job_costs(self, job_id: str | None = None) -> list[dict]:
        return queries.job_costs(self._connection(), job_id)

    def write(self, records: Sequence[Record]) -> None:
        if not records:
            return
        try:
            queries.insert_records(self._connection(), records)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"Nothing was written to the history: {exc}.",
                             hint="this is a bug in the code that built the record") from None

    def optimize(self) -> list[str]:
        return queries.optimize(self._connection())

    def current_version(self) -> int:
        return migrate.current_version(self._connection())

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]:
        """A query of one's own, with ``{name:Type}`` parameters, for diagnostics and tests."""
        return self._connection().select(query, params)

    def _connection(self) -> _ConnectSql:
        with self._ready:
            if self._sql is None:
                self._sql = self._connect()
            return self._sql

    def _connect(self) -> _ConnectSql:
        if self._client is None:
            if not self._own_client:
                raise StoreError(f"The history store {self.url} is closed.", hint="open it again")
            self._client = self._new_client()
        sql = _ConnectSql(self._client, self.url)
        # The database may not exist yet, and a client cannot be created inside
        # a missing one: create it first, then make it the client's database.
        migrate.create_database(sql, self.database)
        self._client.database = self.database
        self.migrated.extend(migrate.apply(sql))
        return sql

    def _new_client(self) -> Any:
        clickhouse_connect = _clickhouse_connect()
        from clickhouse_connect.driver.exceptions import ClickHouseError

        options = {k: v for k, v in self._options.items() if k != "database"}
        try:
            return clickhouse_connect.get_client(
                **options, password=os.environ.get(PASSWORD_ENV, ""),
                # Sessions would serialise the threads sharing this store.
                autogenerate_session_id=False, connect_timeout=10, send_receive_timeout=120)
        except ClickHouseError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"The history store {self.url} cannot be reached: {first}", hint=_hint(self.url)
                             ) from exc
