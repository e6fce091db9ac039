"""What every history backend offers, the one error type, and where the store lives."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Protocol, Sequence, Union, runtime_checkable

from trainwarden.durable import state_directory
from trainwarden.store.records import DeadLetter, FaultRecord, JobRecord, RestartStages

Record = Union[FaultRecord, RestartStages, JobRecord, DeadLetter]


class StoreError(Exception):
    """One sentence saying what went wrong with the history store, and a hint
    saying what the user can do about it (the CLI prints both)."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


class StoreMissing(StoreError):
    """A read asked for a store that was never written: reading must not
    create it (a typo in --store would otherwise look like an empty history)."""


@runtime_checkable
class HistoryReader(Protocol):
    """Query results are lists of dicts; times are float seconds since the epoch."""

    def faults(self, job_id: str | None = None, limit: int | None = None) -> list[dict]: ...

    def aggregate(self, job_id: str | None = None) -> list[dict]: ...

    def restart_stages(self, job_id: str | None = None) -> list[dict]: ...

    def jobs(self, job_id: str | None = None, limit: int | None = None) -> list[dict]: ...

    def dead_letters(self, limit: int = 100) -> list[dict]: ...

    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]:
        """Any read-only query with ``{name:Type}`` parameters (store/analytics.py runs through this)."""

    def current_version(self) -> int: ...

    def optimize(self) -> list[str]: ...

    def spot_transitions(self, job_id: str | None = None) -> list[dict]: ...

    def job_costs(self, job_id: str | None = None) -> list[dict]:
        """Per spot job: state, preemptions, resumes, queued_s, held_s, paid, on_demand."""

    def close(self) -> None: ...

    def __enter__(self) -> "HistoryReader": ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class HistoryWriter(Protocol):
    def write(self, records: Sequence[Record]) -> None: ...

    def close(self) -> None: ...


def default_store_dir() -> Path:
    """$TRAINWARDEN_STORE, else ``store`` in the XDG state directory."""
    return state_directory("store", "TRAINWARDEN_STORE")
