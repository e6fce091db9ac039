"""Running ``trainwarden run`` with the behave.py stand-in job."""

from __future__ import annotations

import re
import sys
from pathlib import Path

BEHAVE = str(Path(__file__).resolve().parent / "programs" / "behave.py")


def run_behave(cli, job_id: str, args: str, *behave: str, nproc: int = 2, timeout: float = 120,
               extra: tuple = (), env: dict | None = None):
    return cli("run", "--job-id", job_id, "--nproc", str(nproc), "--args", args, "--stop-grace", "1", *extra,
               "--", sys.executable, BEHAVE, *behave, timeout=timeout, env=env)


def pids_by_instance(stdout: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for name, pid in re.findall(r"^\[([\w-]+)\] (?:step \d+|hello .*?) pid=(\d+)", stdout, re.M):
        found.setdefault(name, set()).add(int(pid))
    return found


def actions(records: list[dict]) -> list[tuple[str, str]]:
    return [(r["action"], r["result"]) for r in records]


def standby_pids(job_id: str) -> list[int]:
    """Processes of this job that are waiting standbys: the standby script,
    with the job's id in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"standby.py" in cmdline and f"TRAINWARDEN_JOB_ID={job_id}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
