"""The keeper: whatever a runtime started dies with the runtime, however it dies.

A SIGKILLed ``trainwarden run`` or agent runs no code, and the parent-death
signal of its instances reaches only their first process: a shell's children,
a launcher's workers and daemons that called setsid would live on with parent
1. So the process that runs local runtimes starts one keeper process (shared
by all of them, started with the first and ended with the last) that holds
the read end of a pipe from it and learns each instance's process group as it
starts. The kernel closes the pipe when that process ends, in any way; at that
end of file the keeper kills every process of the groups and sessions it was
told of and every process whose environment carries a runtime's mark (which
finds descendants that left both), then exits.

An orderly runtime stops its instances itself (with their grace period) and
releases its lease: then nothing is killed. The keeper is standard library
only and runs as a script (``python -I -S keeper.py``), so that it starts in
milliseconds and never imports the job's or our packages.

Lines on the pipe (MARK is a runtime's mark, PGID an instance's pid, which is
its process group and session): ``mark MARK``, ``group MARK PGID``,
``ended MARK PGID`` (reaped, its orphans killed), ``epitaph MARK PATH`` (a
held history segment to publish if the process dies: the run's job record
saying so), ``spare MARK`` (the run ends itself: no epitaph), ``release MARK``
(the runtime closed: what it still watches is killed), ``close`` (the last
lease ended).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    # Run as a script, its own directory (our runtime package) would come
    # first on the path and could shadow the standard library (Python < 3.11).
    del sys.path[0]

import ctypes
import json
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

MARK_VARIABLE = "TRAINWARDEN_PROCESS_MARK"
_PR_SET_PDEATHSIG = 1
SWEEP_LIMIT_S = 4.0  # processes forking while they are killed: keep sweeping, but not forever
_PARENT_CHECK_S = 1.0


def environment_mark(mark: str) -> bytes:
    """How ``MARK_VARIABLE=mark...`` appears in /proc/PID/environ."""
    return f"{MARK_VARIABLE}={mark}".encode()


def carries(environ: bytes, prefix: bytes) -> bool:
    return environ.startswith(prefix) or b"\0" + prefix in environ


def marked_processes(prefixes: Sequence[bytes], groups: Iterable[int] = ()) -> list[int]:
    """Live processes (not zombies, not this one) in one of ``groups`` (as
    process group or session) or whose environment carries one of ``prefixes``."""
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
            if int(fields[2]) in groups or int(fields[3]) in groups:
                found.append(int(entry.name))
            elif prefixes:
                environ = (entry / "environ").read_bytes()
                if any(carries(environ, prefix) for prefix in prefixes):
                    found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked, or it is not ours to read
    return found


def sweep(prefixes: Sequence[bytes], groups: Iterable[int], limit_s: float = SWEEP_LIMIT_S) -> int:
    """SIGKILL those processes until none is left (a process forking while
    it is killed leaves a child to find on the next pass); how many."""
    groups = set(groups)
    killed: set[int] = set()
    deadline = time.monotonic() + limit_s
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    while True:
        victims = marked_processes(prefixes, groups)
        if not victims or time.monotonic() > deadline:
            return len(killed)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.01)


# ---------------------------------------------------------------- the runtime's side


class _Keeper:
    """The process's keeper: the write end of its pipe. Never raises: without
    a keeper the runtimes still run (their instances keep their parent-death
    signal), and say so once."""

    def __init__(self):
        self._write: Optional[int] = None
        self._process: Optional[subprocess.Popen] = None
        self.leases = 0
        # A write racing the close could hit another file that got the descriptor's number.
        self._pipe_lock = threading.Lock()
        try:
            read, self._write = os.pipe()  # both ends close-on-exec: no instance inherits them
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(Path(__file__).resolve())],
                    stdin=read, stdout=subprocess.DEVNULL, env=_keeper_env(), start_new_session=True)
            finally:
                os.close(read)
        except OSError as exc:
            self._broken(exc)

    @property
    def working(self) -> bool:
        return self._write is not None

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    def send(self, line: str) -> None:
        with self._pipe_lock:
            if self._write is None:
                return
            try:
                # Paths may hold any bytes.
                os.write(self._write, line.encode("utf-8", "surrogateescape"))
                return
            except OSError as exc:
                failure = exc
        self.close_pipe()
        self._broken(failure)

    def end(self, timeout_s: float = 5.0) -> None:
        self.send("close\n")
        self.close_pipe()
        if self._process is not None:
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def close_pipe(self) -> None:
        with self._pipe_lock:
            fd, self._write = self._write, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _broken(self, exc: BaseException) -> None:
        global _warned
        self._write = None
        if not _warned:
            _warned = True
            print(f"trainwarden: no keeper for the instances' descendants ({exc}); if this process is "
                  f"killed, processes the instances started may outlive it", file=sys.stderr)


_shared: Optional[_Keeper] = None
_shared_lock = threading.Lock()
_warned = False


def _forget_in_child() -> None:
    """A forked child must not hold the pipe open: the keeper would miss its parent's death."""
    global _shared, _shared_lock
    # Locks held by threads of the parent stay held here, by nobody.
    _shared_lock = threading.Lock()
    if _shared is not None:
        _shared._pipe_lock = threading.Lock()
        _shared.close_pipe()
    _shared = None


os.register_at_fork(after_in_child=_forget_in_child)


class KeeperLease:
    """A runtime's use of the process's keeper, from creation to ``close``."""

    def __init__(self, mark: str):
        global _shared
        self.mark = mark
        with _shared_lock:
            if _shared is None or not _shared.working:
                _shared = _Keeper()
            self._keeper = _shared
            self._keeper.leases += 1
            self._keeper.send(f"mark {mark}\n")
        self._closed = False

    @property
    def pid(self) -> Optional[int]:
        return self._keeper.pid

    def watch(self, pgid: int) -> None:
        self._keeper.send(f"group {self.mark} {pgid}\n")

    def forget(self, pgid: int) -> None:
        self._keeper.send(f"ended {self.mark} {pgid}\n")

    def epitaph(self, held: Path) -> None:
        if "\n" not in str(held):
            self._keeper.send(f"epitaph {self.mark} {held}\n")

    def spare(self) -> None:
        self._keeper.send(f"spare {self.mark}\n")

    def close(self) -> None:
        """The runtime's orderly end; the last lease ends the keeper."""
        global _shared
        with _shared_lock:
            if self._closed:
                return
            self._closed = True
            self._keeper.send(f"release {self.mark}\n")
            self._keeper.leases -= 1
            if self._keeper.leases > 0:
                return
            if _shared is self._keeper:
                _shared = None
        self._keeper.end()


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


class _Watched:
    """What the keeper was told: each runtime's mark and its instances' groups."""

    def __init__(self):
        self.groups: dict[str, set[int]] = {}
        self.epitaphs: dict[str, Path] = {}

    def told(self, line: bytes) -> bool:
        """Take one line; False once it says the last runtime closed."""
        text = line.decode("utf-8", "surrogateescape")
        words = text.split()
        if words == ["close"]:
            return False
        if len(words) >= 3 and words[0] == "epitaph":
            self.epitaphs[words[1]] = Path(text.split(" ", 2)[2])
        elif len(words) == 2 and words[0] == "spare":
            self.epitaphs.pop(words[1], None)
        elif len(words) == 2 and words[0] == "mark":
            self.groups.setdefault(words[1], set())
        elif len(words) == 2 and words[0] == "release":
            self.epitaphs.pop(words[1], None)
            left = self.groups.pop(words[1], set())
            if left:  # closed while an instance it watched still runs: it must not outlive its runtime
                sweep([environment_mark(words[1])], left)
        elif len(words) == 3 and words[0] in ("group", "ended") and words[2].isdigit():
            groups = self.groups.setdefault(words[1], set())
            (groups.add if words[0] == "group" else groups.discard)(int(words[2]))
        return True

    def sweep(self) -> int:
        if not self.groups:
            return 0
        prefixes = [environment_mark(mark) for mark in self.groups]
        return sweep(prefixes, set().union(*self.groups.values()))

    def publish_epitaphs(self) -> list[str]:
        """What could not be published, and why."""
        problems = []
        for held in self.epitaphs.values():
            try:
                publish(held)
            except (OSError, ValueError) as exc:
                problems.append(f"{held}: {exc}")
        return problems


def publish(held: Path) -> Path:
    """A held history segment into its spool (store/spool.py's format, under a
    complete segment's name), its job rows ended now: the run died."""
    moment = round(time.time(), 3)
    lines = []
    for raw in held.read_bytes().splitlines():
        if raw.strip():
            line = json.loads(raw)
            if line.get("table") == "jobs":
                line["row"]["finished_at"] = line["row"]["updated_at"] = moment
            lines.append(json.dumps(line, separators=(",", ":")).encode())
    name = f"{time.time_ns():020d}-{os.getpid()}-{1:09d}"
    temp, segment = held.parent / f".{name}.tmp", held.parent / f"{name}.jsonl"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        data = memoryview(b"\n".join(lines) + b"\n")
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, segment)
    held.unlink()
    directory = os.open(held.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return segment


def keep(source: int = 0) -> int:
    parent = os.getppid()
    # A terminal's signals, or a service manager's SIGTERM to every process
    # of the unit, are for the run or agent, which tells us; we end with it.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    _die_with_parent(signal.SIGUSR1)
    watched = _Watched()
    pending = b""
    poller = select.poll()  # not select: no limit on the descriptors' numbers
    poller.register(source, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll(_PARENT_CHECK_S * 1000)}
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
            if not watched.told(line):
                return 0
    killed = watched.sweep()
    problems = watched.publish_epitaphs()
    try:
        if killed:
            print(f"trainwarden keeper: the runtimes ended without stopping their instances; "
                  f"killed {killed} processes they left", file=sys.stderr, flush=True)
        for problem in problems:
            print(f"trainwarden keeper: could not record that the run died: {problem}", file=sys.stderr,
                  flush=True)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 1:
        print("usage: keeper.py (started by trainwarden's local runtime, reads its standard input)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(keep())
