"""The keeper: whatever a runtime started dies with the runtime, however it dies.

A SIGKILLed ``trainwarden run`` or agent runs no code, and the parent-death
signal of its instances reaches only their first process: a shell's children,
a launcher's workers and daemons that called setsid would live on with parent
1. So every ``LocalRuntime`` starts one keeper process that holds the read end
of a pipe from it and learns each instance's process group as it starts. The
kernel closes the pipe when the runtime's process ends, in any way; at that
end of file the keeper kills every process of those groups and sessions and
every process whose environment carries the runtime's mark (which finds
descendants that left both), then exits.

An orderly runtime stops its instances itself (with their grace period) and
tells the keeper ``close``: then nothing is killed. The keeper is standard
library only and runs as a script (``python -I -S keeper.py MARK``), so that
it starts in milliseconds and never imports the job's or our packages.

Lines on the pipe: ``group PGID`` (an instance started in its own session,
PGID = its pid), ``ended PGID`` (it was reaped and its orphans killed),
``close`` (orderly end).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

MARK_VARIABLE = "TRAINWARDEN_PROCESS_MARK"
_PR_SET_PDEATHSIG = 1
SWEEP_LIMIT_S = 4.0  # processes forking while they are killed: keep sweeping, but not forever
_PARENT_CHECK_S = 1.0


def environment_mark(mark: str) -> bytes:
    """How ``MARK_VARIABLE=mark...`` appears in /proc/PID/environ."""
    return f"{MARK_VARIABLE}={mark}".encode()


def carries(environ: bytes, prefix: bytes) -> bool:
    return environ.startswith(prefix) or b"\0" + prefix in environ


def marked_processes(prefix: bytes, groups: Iterable[int] = ()) -> list[int]:
    """Live processes (not zombies, not this one) in one of ``groups`` (as
    process group or session) or whose environment carries ``prefix``."""
    groups = set(groups)
    own = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            stat = (entry / "stat").read_bytes()
            # After the command's parentheses (which may hold anything): state ppid pgrp session ...
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] == b"Z":
                continue
            if int(fields[2]) in groups or int(fields[3]) in groups or \
                    (prefix and carries((entry / "environ").read_bytes(), prefix)):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked, or it is not ours to read
    return found


def sweep(prefix: bytes, groups: Iterable[int], limit_s: float = SWEEP_LIMIT_S) -> int:
    """SIGKILL those processes until none is left (a process forking while
    it is killed leaves a child to find on the next pass); how many."""
    groups = set(groups)
    killed = 0
    deadline = time.monotonic() + limit_s
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    while True:
        victims = marked_processes(prefix, groups)
        if not victims or time.monotonic() > deadline:
            return killed
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.01)


# ---------------------------------------------------------------- the runtime's side


class Keeper:
    """The runtime's handle on its keeper process. Never raises: without a
    keeper the runtime still runs (its instances keep their parent-death
    signal), and says so once."""

    def __init__(self, mark: str):
        self.mark = mark
        self._write: Optional[int] = None
        self._process: Optional[subprocess.Popen] = None
        self._warned = False
        try:
            read, self._write = os.pipe()  # both ends close-on-exec: no instance inherits them
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(Path(__file__).resolve()), mark],
                    stdin=read, stdout=subprocess.DEVNULL, env=_keeper_env(), start_new_session=True)
            finally:
                os.close(read)
        except OSError as exc:
            self._broken(exc)

    def watch(self, pgid: int) -> None:
        self._send(f"group {pgid}\n")

    def forget(self, pgid: int) -> None:
        self._send(f"ended {pgid}\n")

    def close(self, timeout_s: float = 5.0) -> None:
        """An orderly end: the keeper exits, killing only groups still watched."""
        self._send("close\n")
        self._close_pipe()
        if self._process is not None:
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    def _send(self, line: str) -> None:
        if self._write is None:
            return
        try:
            os.write(self._write, line.encode())  # one short write: atomic between threads
        except OSError as exc:
            self._close_pipe()
            self._broken(exc)

    def _close_pipe(self) -> None:
        fd, self._write = self._write, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _broken(self, exc: BaseException) -> None:
        self._write = None
        if not self._warned:
            self._warned = True
            print(f"trainwarden: no keeper for the instances' descendants ({exc}); if this process is "
                  f"killed, processes the instances started may outlive it", file=sys.stderr)


def _keeper_env() -> dict:
    """Nothing of a job: the keeper must never look like one of its processes."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("TRAINWARDEN_") and not key.startswith("PYTHON")}


# ---------------------------------------------------------------- the keeper process


def _die_with_parent(sig: int) -> None:
    """Linux signals us when the thread that forked us ends; we then check
    whether the process itself is gone. The pipe's end of file covers the
    rest (and other systems)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def keep(mark: str, source: int = 0) -> int:
    prefix = environment_mark(mark)
    parent = os.getppid()
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's signals are for the run, which tells us
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    _die_with_parent(signal.SIGUSR1)
    groups: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([source, wake_r], [], [], _PARENT_CHECK_S)
        if wake_r in ready:
            os.read(wake_r, 256)
        if os.getppid() != parent:
            break
        if source not in ready:
            continue
        data = os.read(source, 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            word, _, value = line.decode("ascii", "replace").partition(" ")
            if word == "close":
                if groups:
                    sweep(prefix, groups)
                return 0
            if value.isdigit() and word in ("group", "ended"):
                (groups.add if word == "group" else groups.discard)(int(value))
    killed = sweep(prefix, groups)
    if killed:
        try:
            print(f"trainwarden keeper: the runtime ended without stopping its instances; "
                  f"killed {killed} processes they left", file=sys.stderr, flush=True)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1]:
        print("usage: keeper.py MARK (started by trainwarden's local runtime)", file=sys.stderr)
        sys.exit(2)
    sys.exit(keep(sys.argv[1]))
