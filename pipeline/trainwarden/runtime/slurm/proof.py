"""How an agent knows which incarnation a standby-started task is.

A fresh task's command carries its incarnation's token in the environment
it was executed with (``/proc/PID/environ``). A standby became its instance
long after its exec, so its environ holds no token; the task wrapper
(task.py) that asked for it does: srun started it with the step's tokens
(``handoff.TASK_TOKENS``, its own at ``SLURM_PROCID``). The agent then
accepts the standby's pid P for the wrapper T's incarnation only when the
kernel says that P holds T's very stdin, stdout and stderr: the same open
file descriptions (``kcmp(KCMP_FILE)``), which a process gets only by
inheriting them or being handed them, never by opening a path; and that P
runs with T's user ids and leads its own session and process group, which
the agent signals. A job can thus make an agent adopt only a process that
it started or handed its own descriptors to, of its own user, as before
with the token.

An instance whose process is gone before its agent looked (a command that
ends at once, or never starts) has no environ left to prove anything; its
task wrapper, executed with the step's tokens as above, vouches for it
instead when its own environment says it is that very task of that very
step (``wrapper_token``), and waits for its agent before it exits
(task.py), so that the proof outlives the instance.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Optional

from trainwarden.runtime.slurm.handoff import STREAMS, TASK_TOKENS

_KCMP = {"x86_64": 312, "amd64": 312, "aarch64": 272, "arm64": 272, "riscv64": 272, "i686": 349, "i386": 349,
         "armv7l": 378, "ppc64le": 354, "ppc64": 354, "s390x": 343}
_KCMP_FILE = 0
_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall


def same_open_file(pid1: int, fd1: int, pid2: int, fd2: int) -> Optional[bool]:
    """Whether two descriptors are one open file description; None when the
    kernel cannot say (no kcmp here, a process gone, no permission)."""
    number = _KCMP.get(platform.machine())
    if number is None:
        return None
    result = _syscall()(ctypes.c_long(number), ctypes.c_long(pid1), ctypes.c_long(pid2), ctypes.c_long(_KCMP_FILE),
                        ctypes.c_ulong(fd1), ctypes.c_ulong(fd2))
    return None if result < 0 else result == 0


def can_prove() -> bool:
    """This machine's kernel answers kcmp (checked on this process's own stdio)."""
    return same_open_file(os.getpid(), 2, os.getpid(), 2) is True


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def task_token(task_pid: int) -> Optional[str]:
    """A task wrapper's own token: the one at its SLURM_PROCID among the step's tokens it was executed with."""
    return _own_token(_environ(task_pid))


def _own_token(environ: dict[bytes, bytes]) -> Optional[str]:
    tokens, procid = environ.get(TASK_TOKENS.encode()), environ.get(b"SLURM_PROCID", b"")
    if tokens is None or not procid.isdigit():
        return None
    listed = tokens.split()
    index = int(procid)
    return listed[index].decode("utf-8", errors="replace") if index < len(listed) else None


def _uids(pid: int) -> Optional[str]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return " ".join(line.split(":", 1)[1].split())  # real, effective, saved, filesystem
    except OSError:
        pass
    return None


def _leads_its_session(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[2]) == pid and int(fields[3]) == pid


def standby_token(task_pid: int, pid: int) -> Optional[str]:
    """The token of the task wrapper ``task_pid`` when ``pid`` is the standby
    that became its instance (see the module's docstring); else None."""
    if task_pid <= 0 or pid <= 0 or task_pid == pid:
        return None
    token = task_token(task_pid)
    if token is None:
        return None
    uids = _uids(pid)
    if uids is None or uids != _uids(task_pid) or not _leads_its_session(pid):
        return None
    if not all(same_open_file(task_pid, fd, pid, fd) for fd in range(STREAMS)):
        return None
    return token


def wrapper_token(task_pid: int, job_id: int, step_id: int, task_id: int) -> Optional[str]:
    """The token of the task wrapper ``task_pid`` when srun started it as
    task ``task_id`` of step ``job_id.step_id`` (its environment says so);
    else None. What vouches for an instance whose own process is gone
    before the agent looked (it ended at once, or never started): its
    wrapper waits for the agent (task.py), and only that very task's
    wrapper can vouch for that task's manifest."""
    if task_pid <= 0:
        return None
    environ = _environ(task_pid)
    step = environ.get(b"SLURM_STEP_ID", environ.get(b"SLURM_STEPID"))
    if (environ.get(b"SLURM_JOB_ID"), step, environ.get(b"SLURM_PROCID")) != (
            str(job_id).encode(), str(step_id).encode(), str(task_id).encode()):
        return None
    return _own_token(environ)
