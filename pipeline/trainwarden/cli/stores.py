"""Which history store a command means, and opening it to read."""

from __future__ import annotations

import argparse

from trainwarden.cli.output import fail
from trainwarden.store import HistoryReader, default_store_dir, open_reader


def store_target(args: argparse.Namespace) -> str:
    """--store, else $TRAINWARDEN_STORE, else the per-user state directory."""
    return getattr(args, "store", None) or str(default_store_dir())


def open_existing(target: str) -> HistoryReader:
    """A reader that refuses a directory no writer used (StoreMissing) instead
    of creating an empty store there: a read never makes a store."""
    reader = open_reader(target)
    require = getattr(reader, "require_existing", None)  # a directory; a server has its own database
    if require is not None:
        require()
    return reader


def job_known(reader: HistoryReader, job: str) -> bool:
    """The store has the job's record or a fault record of it."""
    return bool(reader.jobs(job_id=job) or reader.faults(job_id=job, limit=1))


def no_such_job(store: str, job: str) -> int:
    """Exit 2, as for any name that is not there."""
    return fail(f"the history store {store} has no job {job!r}",
                hint="'trainwarden history --jobs' lists the jobs it has")
