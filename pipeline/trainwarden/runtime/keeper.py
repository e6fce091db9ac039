"""The keeper: whatever a runtime started dies with the runtime, however it
dies, unless a new run of the agent takes it back in time.

A SIGKILLed ``trainwarden run`` or agent runs no code, and the parent-death
signal of its instances reaches only their first process: a shell's children,
a launcher's workers and daemons that called setsid would live on with parent
1. So the process that runs local runtimes starts one keeper process (shared
by all of them, started with the first and ended with the last; its side is
``runtime/keeper_lease.py``) that holds one end of a Unix socket pair from
it and learns each instance's process group as it starts. The kernel closes
the pair when that process ends, in any way; at that end of file the keeper
kills every process of the groups and sessions it was told of and every
process whose environment carries a runtime's mark (which finds descendants
that left both), then exits.

An agent may have the keeper start its instances (``spawn``): the keeper is
then their parent (it reaps them and tells their exit status) and holds a
copy of each output pipe's read end. Such an agent also hands it a listening
socket and a grace period (``listen``): at the agent's end of file the
keeper kills nothing yet; it keeps reaping, and the first new run of the
agent (same user) that connects within the grace period gets every kept
instance, its status and its pipes, and becomes the keeper's runtime. Only
when none comes is everything killed.

An orderly runtime stops its instances itself (with their grace period) and
releases its lease: then nothing is killed. The keeper is standard library
only and runs as a script (``python -I -S keeper.py``), so that it starts in
milliseconds and never imports the job's or our packages.

Messages (one each; MARK is a runtime's mark, PGID an instance's pid, which is
its process group and session): ``mark MARK``, ``group MARK PGID``,
``ended MARK PGID`` (reaped, its orphans killed), ``epitaph MARK PATH`` (a
held history segment to publish if the process dies: the run's job record
saying so), ``spare MARK`` (the run ends itself: no epitaph), ``release MARK``
(the runtime closed: what it still watches is killed), ``close`` (the last
lease ended), ``spawn ID MARK JSON`` with four descriptors (stdout's and
stderr's write ends, then their read ends; answered ``spawned ID PID`` or
``failed ID ERRNO TEXT``, and later ``exited PID STATUS``), ``listen GRACE``
with a listening socket. To a new run: ``kept JSON`` with two descriptors
per instance, then ``kept-end PID`` (the keeper's own: the listening socket's
credentials are its creator's, the previous run).
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
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

MARK_VARIABLE = "TRAINWARDEN_PROCESS_MARK"
_PR_SET_PDEATHSIG = 1
SWEEP_LIMIT_S = 4.0  # processes forking while they are killed: keep sweeping, but not forever
_PARENT_CHECK_S = 1.0
MAX_MESSAGE_BYTES = 1 << 20  # a spawn: the instance's argv and environment
MAX_FDS = 4


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


class _Kept:
    """An instance the keeper started for an agent (``spawn``): its process,
    and the read ends of its output pipes, held so that they outlive the agent."""

    def __init__(self, popen: subprocess.Popen, mark: str, fds: list, descriptor: str):
        self.popen = popen
        self.mark = mark
        self.fds = fds
        self.descriptor = descriptor
        self.status: Optional[int] = None  # Popen's returncode once it ended
        self.told = False  # its status was sent to the agent connected now

    def close(self) -> None:
        _close_all(self.fds)
        self.fds = []


class _Host:
    """The keeper's state: what it watches, what it started, where a new run
    of the agent may reach it."""

    def __init__(self):
        self.watched = _Watched()
        self.kept: dict[int, _Kept] = {}
        self.listener: Optional[socket.socket] = None
        self.grace_s = 0.0

    def take(self, channel: socket.socket, data: bytes, fds: list) -> bool:
        """One message of the agent; False once it says the last runtime closed."""
        data = data.rstrip(b"\n")
        words = data.split(b" ", 3)
        if words[0] == b"spawn" and len(words) == 4 and len(fds) == 4:
            self._spawn(channel, words[1].decode(), words[2].decode("utf-8", "surrogateescape"), words[3], fds)
            return True
        if words[0] == b"listen" and len(fds) == 1:
            if self.listener is not None:
                self.listener.close()
            self.listener = socket.socket(fileno=fds[0])
            self.grace_s = float(words[1]) if len(words) > 1 else 0.0
            return True
        _close_all(fds)  # a message that carries none: never kept open by mistake
        if words[0] == b"ended" and len(words) == 3 and words[2].isdigit():
            kept = self.kept.pop(int(words[2]), None)
            if kept is not None:
                kept.close()
        elif words[0] == b"release" and len(words) == 2:
            mark = words[1].decode("utf-8", "surrogateescape")
            for pid in [pid for pid, kept in self.kept.items() if kept.mark == mark]:
                self.kept.pop(pid).close()
        return self.watched.told(data)

    def _spawn(self, channel: socket.socket, request: str, mark: str, body: bytes, fds: list) -> None:
        out_w, err_w, out_r, err_r = fds
        try:
            spec = json.loads(body)
            user = spec.get("user")
            popen = subprocess.Popen(
                spec["argv"], env=spec["env"], cwd=spec.get("cwd"), stdin=subprocess.DEVNULL, stdout=out_w,
                stderr=err_w, start_new_session=True,
                **({"user": user, "group": spec.get("group"), "extra_groups": []} if user is not None else {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _close_all([out_r, err_r])
            number = getattr(exc, "errno", None) or 0
            _send(channel, f"failed {request} {number} {exc}".encode("utf-8", "surrogateescape"))
            return
        finally:
            _close_all([out_w, err_w])
        self.kept[popen.pid] = _Kept(popen, mark, [out_r, err_r], spec.get("keep", ""))
        self.watched.groups.setdefault(mark, set()).add(popen.pid)
        _send(channel, f"spawned {request} {popen.pid}".encode())

    def reap(self, channel: Optional[socket.socket]) -> None:
        for pid, kept in self.kept.items():
            if kept.status is None:
                kept.status = kept.popen.poll()
            if kept.status is not None and channel is not None and not kept.told:
                kept.told = True
                _send(channel, f"exited {pid} {kept.status}".encode())

    def waits_for_agent(self) -> bool:
        """After the agent's end: may a new run of it take what runs here?"""
        return self.listener is not None and self.grace_s > 0 and bool(self.kept)

    def hand_over(self, conn: socket.socket) -> bool:
        """Everything kept, to a new run of the agent; False if it is not ours."""
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        except OSError:
            return False
        if uid != os.getuid():
            return False
        conn.settimeout(10.0)
        try:
            for pid, kept in self.kept.items():
                entry = {"pid": pid, "mark": kept.mark, "status": kept.status, "keep": kept.descriptor}
                socket.send_fds(conn, [b"kept " + json.dumps(entry).encode()], kept.fds)
                kept.told = kept.status is not None
            _send(conn, f"kept-end {os.getpid()}".encode())
        except OSError:
            return False
        conn.settimeout(None)
        return True


def _send(channel: socket.socket, data: bytes) -> None:
    try:
        channel.sendall(data)
    except OSError:
        pass  # the agent is gone: what it missed is handed to its next run


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _receive(channel: socket.socket) -> tuple[bytes, list]:
    """One message and the descriptors it carries; b"" at the agent's end."""
    try:
        data, fds, _flags, _ = socket.recv_fds(channel, MAX_MESSAGE_BYTES, MAX_FDS)
    except OSError:
        return b"", []
    return data, fds


def keep(source: int = 0) -> int:
    channel: Optional[socket.socket] = socket.socket(fileno=source)
    parent: Optional[int] = os.getppid()
    # A terminal's signals, or a service manager's SIGTERM to every process
    # of the unit, are for the run or agent, which tells us; we end with it.
    # Caught, not ignored: an instance started here gets their default back.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(sig, lambda signum, frame: None)
    _die_with_parent(signal.SIGUSR1)
    host = _Host()
    deadline = 0.0  # waiting for a new run of the agent until then
    poller = select.poll()  # not select: no limit on the descriptors' numbers
    poller.register(channel.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll(_PARENT_CHECK_S * 1000)}
        if wake_r in ready:
            os.read(wake_r, 256)
        host.reap(channel)
        if channel is None:
            listener = host.listener
            if listener is not None and listener.fileno() in ready:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                if host.hand_over(conn):
                    poller.unregister(listener.fileno())
                    channel = conn
                    poller.register(channel.fileno(), select.POLLIN)
                else:
                    conn.close()
            elif time.monotonic() > deadline:
                break
            continue
        gone = parent is not None and os.getppid() != parent
        data, fds = _receive(channel) if channel.fileno() in ready else (None, [])
        if data is not None and data:
            if not host.take(channel, data, fds):
                return 0
            continue
        if data is None and not gone:
            continue
        # The agent (or run) ended without closing: its next run may take what runs here.
        poller.unregister(channel.fileno())
        channel.close()
        channel, parent = None, None
        if not host.waits_for_agent():
            break
        for kept in host.kept.values():
            kept.told = False
        poller.register(host.listener.fileno(), select.POLLIN)
        deadline = time.monotonic() + host.grace_s
    killed = host.watched.sweep()
    problems = host.watched.publish_epitaphs()
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
