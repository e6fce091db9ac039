"""The C4D diagnostic channel: what C4D's collector says about this node.

A finding may isolate a node, so it is accepted only from a channel no job
can write:

- ``--c4d-socket PATH``: a Unix socket C4D's collector connects to and writes
  lines into. Who connects is checked (SO_PEERCRED): a process of any
  instance (by parent chain, a descendant of this Trainwarden process, or one
  carrying an instance's marker) is refused, counted and dead-lettered.
  ``python -m trainwarden.runtime.c4d_source --socket PATH [FILE]`` is such a
  collector: it forwards C4D's output (standard input, or FILE followed like
  ``tail -F``) to the socket, reconnecting when the supervisor restarts.
- ``--c4d-log FILE``: C4D's own log, followed like ``tail -F`` (new lines
  from the end at start: what C4D said before is not about this run), only
  when the instances' user (this process's) can neither write the file nor
  replace it through a writable directory above it (``c4d_log_refusal``).

Instances running as root can write anything (and read any process's
memory); these checks stop a job of an ordinary user, and a process of a
job that double-forked and scrubbed its environment is, on the same user,
not told apart from a collector: run instances as another user for that.
"""

from __future__ import annotations

import argparse
import os
import pwd
import queue
import socket
import socketserver
import stat
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

from trainwarden.runtime.connections import BoundedUnixServer, RefusalLog
from trainwarden.runtime.control import ControlServer, descends_from, peer_of

POLL_S = 0.2
MAX_LINE = 64 * 1024
# Collectors connected at once (one is usual; a restart may overlap the old one).
MAX_COLLECTORS = 8
# Connections of one job's processes at once, each held at most REFUSE_READ_S
# while its attempt is read for the dead letter.
MAX_REFUSING = 2
REFUSE_READ_S = 1.0
COLLECTORS = "C4D collectors"


class FileFollower:
    def __init__(self, path: Path, on_line: Callable[[str], None], from_start: bool = False):
        self.path = Path(path)
        self.on_line = on_line
        self.lines = 0
        self._stop = threading.Event()
        self._position = 0 if from_start else self._size()
        self._inode = self._stat_inode()
        self._buffer = b""
        self._thread = threading.Thread(target=self._loop, name=f"follow-{self.path.name}", daemon=True)
        self._thread.start()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def _stat_inode(self) -> int:
        try:
            return self.path.stat().st_ino
        except OSError:
            return -1

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        inode, size = self._stat_inode(), self._size()
        if inode != self._inode or size < self._position:
            self._inode, self._position, self._buffer = inode, 0, b""  # replaced or truncated
        if size <= self._position:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._position)
                chunk = handle.read(size - self._position)
        except OSError:
            return
        self._position += len(chunk)
        data = self._buffer + chunk
        *complete, self._buffer = data.split(b"\n")
        if len(self._buffer) > MAX_LINE:
            self._buffer = b""  # a runaway line is not a diagnosis
        for raw in complete:
            self.lines += 1
            self.on_line(raw.decode("utf-8", errors="replace").rstrip("\r"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.poll()


# ------------------------------------------------------------ the log file

C4D_LOG_HINT = ("give --c4d-socket PATH instead and let C4D's collector connect to it (the peer is checked), "
                "or a --c4d-log file only C4D's user can write")


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def c4d_log_refusal(raw: str) -> Optional[str]:
    """Why a job could write (or replace) this C4D log, as one sentence naming
    the flag, or None when it cannot. Both the path as given and the file it
    resolves to are checked, with every directory above them."""
    given = Path(os.path.abspath(raw))
    real = Path(os.path.realpath(raw))
    for target in dict.fromkeys((given, real)):
        if os.path.lexists(target) and os.access(target, os.W_OK):
            return (f"--c4d-log {raw}: {target} is writable by the user the instances run as ({_user()}), "
                    "so a job could write findings into it")
        child = target
        for directory in target.parents:
            if os.access(directory, os.W_OK) and not _sticky_protects(directory, child):
                return (f"--c4d-log {raw}: the directory {directory} is writable by the user the instances "
                        f"run as ({_user()}), so a job could put a file of its own in the log's place")
            child = directory
    return None


def _sticky_protects(directory: Path, child: Path) -> bool:
    """In a sticky directory (/tmp) only an entry's or the directory's owner may replace the entry."""
    try:
        mode = directory.stat()
        owner = child.lstat().st_uid if os.path.lexists(child) else os.geteuid()
    except OSError:
        return False
    return bool(mode.st_mode & stat.S_ISVTX) and os.geteuid() not in (owner, mode.st_uid)


def c4d_flags_problem(log: Optional[str], sock: Optional[str]) -> Optional[tuple[str, str]]:
    """(sentence, hint) when the C4D flags of ``run`` or ``agent`` cannot be used, else None."""
    if log and sock:
        return "--c4d-log and --c4d-socket are two ways to the same channel: give one", "keep --c4d-socket"
    if log:
        refused = c4d_log_refusal(log)
        return (refused, C4D_LOG_HINT) if refused else None
    if sock:
        problem = socket_problem(sock)
        return (problem, "give a path in a directory this user can write, e.g. /run/trainwarden/c4d.sock") \
            if problem else None
    return None


# ------------------------------------------------------------ the socket

class C4DChannelError(ValueError):
    """The C4D socket cannot be listened on; the message names the flag."""


def socket_problem(raw: str) -> Optional[str]:
    """What stands in the way of listening on this C4D socket path, or None."""
    path = Path(raw)
    if len(os.fsencode(os.path.abspath(raw))) > 100:
        return f"--c4d-socket {raw}: the path is too long for a Unix socket (at most 100 bytes)"
    if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
        return f"--c4d-socket {raw}: it exists and is not a socket"
    if path.exists() and _listened_on(path):
        return f"--c4d-socket {raw}: another process listens on it (a second agent or run on this node?)"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--c4d-socket {raw}: cannot create its directory ({exc.strerror})"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"--c4d-socket {raw}: its directory is not writable"
    return None


def _listened_on(path: Path) -> bool:
    """A socket left by a killed predecessor refuses connections; a live one takes them."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def job_process(pid: int, control: ControlServer) -> Optional[str]:
    """Why this pid is one of the jobs' processes, or None."""
    found = control.attribute(pid)
    if found is not None:
        incarnation = found[1]
        return f"pid {pid} is a process of job {incarnation.job_id}'s instance {incarnation.instance}"
    if descends_from(pid, os.getpid()):
        return f"pid {pid} descends from this Trainwarden process, which starts only instances"
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        environ = b""
    if environ.startswith(b"TRAINWARDEN_TOKEN=") or b"\0TRAINWARDEN_TOKEN=" in environ:
        return f"pid {pid} carries an instance's TRAINWARDEN_TOKEN (a job's process that left its tree)"
    return None



def open_channel(socket_path, log_path, on_line: Callable[[str], None], on_refused: Callable[[str, str], None],
                 control) -> "Optional[C4DSocket | FileFollower]":
    """The trusted diagnostic channel of ``run`` and the agent alike: the
    socket C4D's collector writes to (the job's processes refused: ``on_refused``),
    or C4D's log file; None without either flag."""
    if socket_path:
        return C4DSocket(Path(socket_path), on_line, on_refused, control)
    return FileFollower(Path(log_path), on_line) if log_path else None


class C4DSocket:
    """``--c4d-socket PATH``: lines from C4D's collector; a job's process is refused.

    Bounded (runtime/connections.py): at most ``MAX_COLLECTORS`` collectors
    at once, and a job's processes at most ``MAX_REFUSING`` connections at
    once per job, each read for its first line (at most ``REFUSE_READ_S``)
    only while its refusals are still told one by one; the others are
    counted and closed at once. A collector may stay connected and quiet for
    as long as it likes: it has no idle limit."""

    def __init__(self, path: Path, on_line: Callable[[str], None], on_refused: Callable[[str, str], None],
                 control: ControlServer):
        self.path = Path(path)
        self.lines = 0
        problem = socket_problem(str(path))
        if problem:
            raise C4DChannelError(problem)
        channel = self
        self.refusals = RefusalLog(lambda origin, reason, count: on_refused(
            f"C4D line refused: {count} more connections of {origin} in the last {self.refusals.every_s:g} s "
            f"(the last: {reason}); only C4D's collector may write to the C4D socket", ""))

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                admitted = self.server.admitted(self.request)
                if admitted.peer:
                    channel._refuse(self, admitted.origin, admitted.peer, on_refused)
                    return
                while True:
                    try:
                        raw = self.rfile.readline(MAX_LINE + 1)
                    except OSError:
                        return
                    if not raw:
                        return
                    if len(raw) > MAX_LINE:
                        _skip_rest_of_line(self.rfile)
                        continue  # a runaway line is not a diagnosis
                    channel.lines += 1
                    on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))

        def origin_of(conn: socket.socket) -> tuple[str, str]:
            """(origin, why it is a job's process, or "" for a collector)."""
            pid = peer_of(conn).pid
            why = job_process(pid, control)
            if why is None:
                return COLLECTORS, ""
            found = control.attribute(pid)
            return (f"job {found[1].job_id}" if found else "processes of jobs outside their trees"), why

        def over_cap(conn: socket.socket, origin: str, reason: str, tell: bool) -> None:
            if tell:
                on_refused(f"C4D connection refused: {reason}", "")

        self.path.unlink(missing_ok=True)  # checked above: a socket left by a predecessor
        try:
            self._server = BoundedUnixServer(
                str(self.path), Handler, total=MAX_COLLECTORS + 4 * MAX_REFUSING, origin_of=origin_of,
                cap_of=lambda origin: MAX_COLLECTORS if origin == COLLECTORS else MAX_REFUSING,
                refusals=self.refusals, on_over_cap=over_cap)
        except OSError as exc:
            raise C4DChannelError(f"--c4d-socket {path}: cannot listen on it ({exc.strerror})") from None
        os.chmod(self.path, 0o600)  # the collector runs as this user or as root
        self._thread = threading.Thread(target=self._server.serve_forever, name="c4d-socket", daemon=True)
        self._thread.start()

    @property
    def refused(self) -> int:
        """Connections refused so far, told or only counted."""
        return self.refusals.total

    def _refuse(self, handler, origin: str, why: str, on_refused: Callable[[str, str], None]) -> None:
        """Counted; while this origin's refusals are told one by one,
        dead-lettered with the first line it tried; then hung up on."""
        if not self.refusals.refuse(origin, why):
            return
        handler.request.settimeout(REFUSE_READ_S)
        try:
            attempt = handler.rfile.readline(MAX_LINE).decode("utf-8", errors="replace").rstrip("\r\n")
        except OSError:
            attempt = ""
        on_refused(f"C4D line refused: {why}; only C4D's collector may write to the C4D socket", attempt)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)


def _skip_rest_of_line(stream) -> None:
    while True:
        rest = stream.readline(MAX_LINE)
        if not rest or rest.endswith(b"\n"):
            return


# ------------------------------------------------------------ the forwarder

RECONNECT_S = 0.2
MAX_PENDING = 10_000


def forward(socket_path: str, lines: "queue.Queue[Optional[str]]", stop: threading.Event) -> None:
    """Send each queued line to the socket; reconnect (and resend) while the
    supervisor is away. None in the queue ends it once everything before it
    is sent; ``stop`` ends it at once."""
    conn: Optional[socket.socket] = None
    while not stop.is_set():
        try:
            line = lines.get(timeout=RECONNECT_S)
        except queue.Empty:
            continue
        if line is None:
            break
        data = (line + "\n").encode("utf-8", errors="replace")
        while not stop.is_set():
            try:
                if conn is None:
                    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    conn.connect(socket_path)
                conn.sendall(data)
                break
            except OSError:
                if conn is not None:
                    conn.close()
                conn = None
                stop.wait(RECONNECT_S)
    if conn is not None:
        conn.close()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwarden.runtime.c4d_source",
                                     description="Forward C4D's output to a Trainwarden C4D socket. Run it as "
                                                 "C4D's collector, never from a job.")
    parser.add_argument("--socket", required=True, help="the agent's (or run's) --c4d-socket")
    parser.add_argument("file", nargs="?", help="C4D's log, followed from its end (default: standard input)")
    args = parser.parse_args(argv)
    pending: "queue.Queue[Optional[str]]" = queue.Queue(MAX_PENDING)
    stop = threading.Event()
    if args.file:
        follower = FileFollower(Path(args.file), pending.put)
        try:
            forward(args.socket, pending, stop)
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            follower.close()
        return 0
    sender = threading.Thread(target=forward, args=(args.socket, pending, stop), daemon=True)
    sender.start()
    try:
        for line in sys.stdin:
            pending.put(line.rstrip("\r\n"))
    except KeyboardInterrupt:
        return 0
    pending.put(None)
    sender.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
