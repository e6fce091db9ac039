"""The embedded history store: chDB in this process, shared through a lock.

Layout of a store directory DIR::

    DIR/chdb/        chDB's data
    DIR/spool/       segments from writers (spool.py), ingested on every open
    DIR/spool/bad/   segments that could not be ingested
    DIR/store.lock   the flock that serialises the processes opening chDB

Writers never open chDB, so they never wait. A reader holds the store (lock
taken, chDB session open) only for one method call or for a ``with`` block;
every opening first migrates the schema if needed and ingests the spool, so
two readers in different processes simply take turns.

Inside one process chDB runs a single engine on a single data directory at a
time (opening a second directory fails until the first is closed; afterwards
any directory can be opened), so a process-wide lock serialises
EmbeddedStore instances too. Do not fork inside a ``with`` block: the child
would share the parent's lock and chDB engine.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from chdb import session as chdb_session

from trainwarden.store import locking, migrate, queries
from trainwarden.store.base import Record, StoreError, StoreMissing
from trainwarden.store.ingest import IngestReport, ingest
from trainwarden.store.schema import EMBEDDED_DATABASE

DEFAULT_LOCK_TIMEOUT_S = 30.0

# One chDB engine per process: who holds it. Re-entrant so that an instance
# nested in another one's `with` block in the same thread gets a clear error
# (below) instead of waiting for itself.
_ENGINE = threading.RLock()
_open_store: list[Path] = []


def _after_fork_in_child() -> None:
    # A child forked while another thread had a store open would inherit the
    # lock held by a thread that does not exist in it.
    global _ENGINE
    _ENGINE = threading.RLock()
    _open_store.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _ChdbSql:
    def __init__(self, session: chdb_session.Session, store: Path):
        self._session = session
        self._store = store

    def _run(self, sql: str, fmt: str = "JSONEachRow", params: Mapping[str, object] | None = None,
             what: str = "a query", hint: str = "this is likely a bug in trainwarden"):
        try:
            if params:
                return self._session.query(sql, fmt, params={k: queries.param_text(v) for k, v in params.items()})
            return self._session.query(sql, fmt)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"The history store {self._store} failed {what}: {first}", hint=hint) from exc

    def execute(self, statement: str) -> None:
        self._run(statement, what="a statement")

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]:
        return queries.parse_rows(self._run(query, params=params).bytes())

    def insert(self, statement: str, body: bytes) -> None:
        # chDB takes INSERT data inline after FORMAT, as clickhouse-client does.
        self._run(f"{statement}\n{body.decode('utf-8')}", what="an insert",
                  hint="nothing was lost: spooled records stay in the spool until an insert succeeds")


class EmbeddedStore:
    """Reader of a store directory, and the merger of its spool."""

    def __init__(self, directory: str | os.PathLike, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S):
        # chDB compares engine paths literally: one spelling per directory.
        self.directory = Path(os.path.realpath(directory))
        self.lock_timeout_s = lock_timeout_s
        self.last_ingest = IngestReport()
        self.migrated: list[int] = []  # versions this instance applied
        self._owner: int | None = None
        self._depth = 0
        self._lock_fd: int | None = None
        self._session: chdb_session.Session | None = None
        self._sql: _ChdbSql | None = None
        self._must_exist = False

    def exists(self) -> bool:
        """A writer's spool or an ingested database is there."""
        return any((self.directory / sub).is_dir() for sub in ("chdb", "spool"))

    def require_existing(self) -> "EmbeddedStore":
        """For readers: refuse (StoreMissing) a directory no writer has used, now
        and at every opening, instead of creating an empty store there."""
        self._must_exist = True
        self._check_exists()
        return self

    def _check_exists(self) -> None:
        if self._must_exist and not self.exists():
            what = "holds no history store" if self.directory.is_dir() else "does not exist"
            raise StoreMissing(f"The history store {self.directory} {what}.",
                               hint="give the directory a run or the actuator wrote to (--store or "
                                    "$TRAINWARDEN_STORE); a run creates it")

    def __enter__(self) -> "EmbeddedStore":
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def close(self) -> None:
        """Close the session and release the lock, even inside a ``with`` block."""
        if self._depth and self._owner == threading.get_ident():
            self._depth = 1
            self._leave()

    # HistoryReader

    def faults(self, job_id: str | None = None, limit: int | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.faults(sql, job_id, limit)

    def aggregate(self, job_id: str | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.aggregate(sql, job_id)

    def restart_stages(self, job_id: str | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.restart_stages(sql, job_id)

    def jobs(self, job_id: str | None = None, limit: int | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.jobs(sql, job_id, limit)

    def dead_letters(self, limit: int = 100) -> list[dict]:
        with self._using() as sql:
            return queries.dead_letters(sql, limit)

    def spot_transitions(self, job_id: str | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.spot_transitions(sql, job_id)

    def job_costs(self, job_id: str | None = None) -> list[dict]:
        with self._using() as sql:
            return queries.job_costs(sql, job_id)

    def write(self, records: Sequence[Record]) -> None:
        """Insert directly (the store is open anyway); writers that must not
        wait for the lock use SpoolWriter instead."""
        with self._using() as sql:
            queries.insert_records(sql, records)

    def ingest(self) -> IngestReport:
        """Move the spool into the tables now (opening does this too)."""
        with self._using() as sql:
            self.last_ingest = ingest(sql, self.directory / "spool")
            return self.last_ingest

    def optimize(self) -> list[str]:
        with self._using() as sql:
            return queries.optimize(sql)

    def current_version(self) -> int:
        with self._using() as sql:
            return migrate.current_version(sql)

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]:
        """A read-only query of one's own, with ``{name:Type}`` parameters, for diagnostics and tests."""
        with self._using() as sql:
            return sql.select(query, params)

    # Opening and closing

    @contextmanager
    def _using(self) -> Iterator[_ChdbSql]:
        self._open()
        try:
            assert self._sql is not None
            yield self._sql
        finally:
            self._leave()

    def _open(self) -> None:
        me = threading.get_ident()
        if self._depth and self._owner == me:
            self._depth += 1
            return
        deadline = time.monotonic() + self.lock_timeout_s
        if not _ENGINE.acquire(timeout=self.lock_timeout_s):
            raise StoreError(f"The history store {self.directory} is busy (used by another thread of this "
                             f"process for more than {self.lock_timeout_s:g} s).",
                             hint="share one EmbeddedStore, or keep `with` blocks short")
        try:
            if _open_store:
                raise StoreError(f"The history store {self.directory} cannot be opened while {_open_store[0]} "
                                 "is open in the same thread (chDB runs one store per process at a time).",
                                 hint="leave the other store's `with` block first")
            self._connect(max(0.0, deadline - time.monotonic()))
        except BaseException:
            _ENGINE.release()
            raise
        _open_store.append(self.directory)
        self._owner, self._depth = me, 1

    def _connect(self, lock_timeout_s: float) -> None:
        self._check_exists()
        try:
            for sub in ("chdb", "spool"):
                (self.directory / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"The history store {self.directory} cannot be created: {exc.strerror}.",
                             hint="give a writable directory with --store or TRAINWARDEN_STORE") from None
        self._lock_fd = locking.acquire(self.directory / "store.lock", lock_timeout_s, self.directory,
                                        waited_s=self.lock_timeout_s)
        try:
            try:
                self._session = chdb_session.Session(str(self.directory / "chdb"))
            except RuntimeError as exc:
                raise StoreError(f"The history store {self.directory} could not be opened: "
                                 f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}",
                                 hint=f"is a program other than trainwarden using {self.directory / 'chdb'}?"
                                 ) from exc
            self._sql = _ChdbSql(self._session, self.directory)
            migrate.create_database(self._sql, EMBEDDED_DATABASE)
            self._sql.execute(f"USE {queries.quote_identifier(EMBEDDED_DATABASE)}")
            self.migrated.extend(migrate.apply(self._sql))
            self.last_ingest = ingest(self._sql, self.directory / "spool")
        except BaseException:
            self._disconnect()
            raise

    def _leave(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth:
            return
        try:
            self._disconnect()
        finally:
            self._owner = None
            _open_store.clear()
            _ENGINE.release()

    def _disconnect(self) -> None:
        session, fd = self._session, self._lock_fd
        self._session = self._sql = None
        self._lock_fd = None
        try:
            if session is not None:
                session.close()
        finally:
            if fd is not None:
                locking.release(fd)
