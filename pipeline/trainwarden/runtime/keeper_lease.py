"""A runtime's link to the process's keeper (``runtime/keeper.py``).

Every local runtime of a process (a ``trainwarden run``, an agent's jobs)
shares one keeper, started with the first lease and ended with the last.
The link is a Unix ``SOCK_SEQPACKET`` pair: one message per line of the
keeper's protocol, and the keeper sees its end of file when this process
ends in any way.

An agent that lets a new run of itself take its instances back
(``enable_kept_instances``) has the keeper start them (``KeeperLease.spawn``):
the keeper is then their parent, which reaps them and tells their exit
status, and it holds a copy of each output pipe's read end, so that neither
the processes nor their pipes end with the agent. ``reclaim`` is the new
run's side: it connects to the socket the keeper listens on for a grace
period after the agent's end and takes every kept instance, with its pipes,
and the keeper itself.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import itertools
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping, Optional, Sequence

from trainwarden.runtime import keeper as keeper_script

SPAWN_REPLY_S = 10.0
# A spawn carries the instance's environment (Linux allows 2 MiB of argv and environment).
SEND_BUFFER_BYTES = keeper_script.MAX_MESSAGE_BYTES + 4096


class KeeperUnavailable(Exception):
    """The keeper cannot start this instance: the caller starts it itself."""


@dataclasses.dataclass(frozen=True)
class KeptInstance:
    """An instance a previous run of the agent had the keeper start, taken back."""

    pid: int
    mark: str  # the runtime's mark (its keeper group)
    status: Optional[int]  # its exit status (Popen's returncode) if it ended meanwhile
    keep: Mapping  # what the previous run said of it at the start (``KeeperLease.spawn``'s ``keep``)
    stdout: int  # the read ends of its output pipes, now this process's
    stderr: int


class KeptProcess:
    """An instance the keeper started, as much of ``subprocess.Popen`` as the runtime uses."""

    def __init__(self, pid: int, link: "_Keeper"):
        self.pid = pid
        self.returncode: Optional[int] = None
        self._link = link

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            code = self._link.exits.get(self.pid)
            if code is None and self._link.gone:
                code = -9  # the keeper died, and its instances with it (their parent-death signal)
            self.returncode = code
        return self.returncode

    def forget(self) -> None:
        self._link.exits.pop(self.pid, None)


class _Keeper:
    """The process's keeper, seen from here. Never raises: without a keeper
    the runtimes still run (their instances keep their parent-death signal),
    and say so once."""

    def __init__(self, channel: Optional[socket.socket] = None, pid: Optional[int] = None):
        self._channel: Optional[socket.socket] = None
        self._process: Optional[subprocess.Popen] = None
        self._pid = pid
        self.leases = 0
        self.spawns = False
        self.gone = False
        self.exits: dict[int, int] = {}
        self._replies: dict[int, list] = {}
        self._requests = itertools.count(1)
        self._reader: Optional[threading.Thread] = None
        # A send racing the close could hit another file that got the descriptor's number.
        self._lock = threading.Lock()
        if channel is not None:
            self._channel = channel
            return
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # close-on-exec
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(Path(keeper_script.__file__).resolve())],
                    stdin=theirs.fileno(), stdout=subprocess.DEVNULL, env=_keeper_env(), start_new_session=True)
            finally:
                theirs.close()
            self._channel = ours
            self._pid = self._process.pid
        except OSError as exc:
            self._broken(exc)

    @property
    def working(self) -> bool:
        return self._channel is not None

    @property
    def pid(self) -> Optional[int]:
        return self._pid

    def send(self, line: str, fds: Sequence[int] = ()) -> bool:
        with self._lock:
            if self._channel is None:
                return False
            try:
                # Paths may hold any bytes.
                socket.send_fds(self._channel, [line.encode("utf-8", "surrogateescape")], list(fds))
                return True
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:
                    raise KeeperUnavailable(f"too large for the keeper ({exc})") from exc
                failure = exc
        self.close_channel()
        self._broken(failure)
        return False

    # ------------------------------------------------------------ starting instances

    def enable_spawns(self) -> None:
        with self._lock:
            if self._channel is None or self.spawns:
                return
            self.spawns = True
            self._channel.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            self._reader = threading.Thread(target=self._read, name="keeper-link", daemon=True)
            self._reader.start()

    def spawn(self, mark: str, spec: dict, fds: Sequence[int]) -> int:
        request = next(self._requests)
        waiting = self._replies[request] = [threading.Event(), None]
        try:
            if not self.send(f"spawn {request} {mark} {json.dumps(spec)}", fds):
                raise KeeperUnavailable("the keeper is gone")
            if not waiting[0].wait(SPAWN_REPLY_S) or waiting[1] is None:
                raise KeeperUnavailable("the keeper did not answer")
        finally:
            self._replies.pop(request, None)
        reply = waiting[1]
        if reply[0] == "spawned":
            return int(reply[1])
        number = int(reply[1]) if reply[1].isdigit() else 0
        raise OSError(number or errno.EIO, reply[2] if len(reply) > 2 else "the keeper could not start it")

    def _read(self) -> None:
        channel = self._channel
        while channel is not None:
            try:
                data = channel.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            words = data.decode("utf-8", "surrogateescape").split(" ", 3)
            if words[0] == "exited" and len(words) == 3:
                self.exits[int(words[1])] = int(words[2])
            elif words[0] in ("spawned", "failed") and len(words) >= 3:
                waiting = self._replies.get(int(words[1]))
                if waiting is not None:
                    waiting[1] = [words[0], *words[2:]]
                    waiting[0].set()
        self.gone = True
        for waiting in list(self._replies.values()):
            waiting[0].set()

    # ------------------------------------------------------------ ending

    def end(self, timeout_s: float = 5.0) -> None:
        self.send("close")
        self.close_channel()
        if self._process is not None:
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        elif self._pid is not None:
            _wait_for_exit(self._pid, timeout_s)  # a previous run's keeper: not our child

    def close_channel(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            try:
                channel.shutdown(socket.SHUT_RDWR)  # wakes our reader; the keeper sees its end of file
            except OSError:
                pass
            channel.close()

    def _broken(self, exc: BaseException) -> None:
        global _warned
        self._channel = None
        if not _warned:
            _warned = True
            print(f"trainwarden: no keeper for the instances' descendants ({exc}); if this process is "
                  f"killed, processes the instances started may outlive it", file=sys.stderr)


_shared: Optional[_Keeper] = None
_shared_lock = threading.Lock()
_warned = False


def _forget_in_child() -> None:
    """A forked child must not hold the link open: the keeper would miss its parent's death."""
    global _shared, _shared_lock
    # Locks held by threads of the parent stay held here, by nobody.
    _shared_lock = threading.Lock()
    if _shared is not None:
        _shared._lock = threading.Lock()
        channel, _shared._channel = _shared._channel, None
        if channel is not None:
            channel.close()  # a close, not a shutdown: the parent's link stays up
    _shared = None


os.register_at_fork(after_in_child=_forget_in_child)


def _the_keeper() -> _Keeper:
    global _shared
    if _shared is None or not _shared.working:
        _shared = _Keeper()
    return _shared


class KeeperLease:
    """A runtime's use of the process's keeper, from creation to ``close``."""

    def __init__(self, mark: str):
        self.mark = mark
        with _shared_lock:
            self._keeper = _the_keeper()
            self._keeper.leases += 1
            self._keeper.send(f"mark {mark}")
        self._closed = False

    @property
    def pid(self) -> Optional[int]:
        return self._keeper.pid

    @property
    def link(self) -> _Keeper:
        return self._keeper

    @property
    def spawns(self) -> bool:
        """The keeper starts this runtime's instances (``enable_kept_instances``)."""
        return self._keeper.spawns and self._keeper.working

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str], user: Optional[int],
              group: Optional[int], keep: Mapping) -> tuple[KeptProcess, int, int]:
        """The instance started by the keeper, in a session of its own, its
        output to two pipes: (its process, the read ends of stdout and
        stderr). ``keep``: what a new run of the agent needs to take it back.
        OSError: it could not start; KeeperUnavailable: start it yourself."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = self._keeper.spawn(self.mark, {"argv": list(argv), "env": dict(env), "cwd": cwd, "user": user,
                                                 "group": group, "keep": json.dumps(dict(keep))},
                                     [out_w, err_w, out_r, err_r])
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w):
                os.close(fd)
        return KeptProcess(pid, self._keeper), out_r, err_r

    def watch(self, pgid: int) -> None:
        self._keeper.send(f"group {self.mark} {pgid}")

    def forget(self, pgid: int) -> None:
        self._keeper.send(f"ended {self.mark} {pgid}")

    def epitaph(self, held: Path) -> None:
        if "\n" not in str(held):
            self._keeper.send(f"epitaph {self.mark} {held}")

    def spare(self) -> None:
        self._keeper.send(f"spare {self.mark}")

    def close(self) -> None:
        """The runtime's orderly end; the last lease ends the keeper."""
        global _shared
        with _shared_lock:
            if self._closed:
                return
            self._closed = True
            self._keeper.send(f"release {self.mark}")
            self._keeper.leases -= 1
            if self._keeper.leases > 0:
                return
            if _shared is self._keeper:
                _shared = None
        self._keeper.end()


# ---------------------------------------------------------------- an agent's instances outliving it


def enable_kept_instances(listener: socket.socket, grace_s: float) -> None:
    """From now on the keeper starts this process's instances, and after this
    process's end waits ``grace_s`` for a new run of it on ``listener``."""
    with _shared_lock:
        link = _the_keeper()
        link.enable_spawns()
        link.send(f"listen {grace_s:g}", [listener.fileno()])


def socket_path_for(directory: Path) -> Path:
    """Where the keeper of an agent whose files are in ``directory`` waits
    for its next run: fixed by the directory, short enough for a socket."""
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"tw-keeper-{digest}" / "keeper.sock"
    return path if len(str(path)) < 100 else Path("/tmp") / f"tw-keeper-{digest}" / "keeper.sock"


def listen_at(path: Path) -> socket.socket:
    """A listening socket at ``path``, in a directory only this user may enter."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = directory.stat()
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise PermissionError(errno.EPERM, f"{directory} must be this user's alone (mode 0700)")
    path.unlink(missing_ok=True)  # the previous run's: the keeper holds its listener open, not its name
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(4)
    return listener


def reclaim(path: Path, timeout_s: float = 10.0) -> list[KeptInstance]:
    """What the keeper of a previous run of this agent kept, if it waits at
    ``path``: its instances, their pipes, and the keeper itself as this
    process's keeper. Empty when none waits."""
    global _shared
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(path))
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            raise PermissionError(errno.EPERM, f"the keeper at {path} runs as uid {uid}")
        conn.settimeout(timeout_s)
        kept = []
        while True:
            data, fds, _flags, _ = socket.recv_fds(conn, keeper_script.MAX_MESSAGE_BYTES, 2)
            if data.startswith(b"kept-end "):
                pid = int(data.split()[1])
                break
            if not data.startswith(b"kept ") or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                raise ConnectionError(f"the keeper at {path} answered {data[:40]!r}")
            entry = json.loads(data[5:])
            for fd in fds:
                os.set_blocking(fd, False)
            kept.append(KeptInstance(pid=entry["pid"], mark=entry["mark"], status=entry["status"],
                                     keep=json.loads(entry["keep"] or "{}"), stdout=fds[0], stderr=fds[1]))
        conn.settimeout(None)
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        return []
    except BaseException:
        conn.close()
        raise
    with _shared_lock:
        link = _Keeper(channel=conn, pid=pid)
        link.enable_spawns()
        for item in kept:
            if item.status is not None:
                link.exits[item.pid] = item.status
        _shared = link
    return kept


def _wait_for_exit(pid: int, timeout_s: float) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)


def _keeper_env() -> dict:
    """Nothing of a job: the keeper must never look like one of its processes."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("TRAINWARDEN_") and not key.startswith("PYTHON")}
