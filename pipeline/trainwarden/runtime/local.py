"""Instances as local processes: the embedded default's "cluster".

Each instance runs in its own process group (so a stop reaches its data
loader children too). One I/O thread reads every pipe, splits lines (``\\n``,
``\\r\\n`` and the ``\\r`` of progress bars), bounds their length, stamps them
with the time they were read and hands LogLine events to the sink, followed
by the InstanceExited event once the process is gone and its pipes drained.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import re
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from trainwarden.clock import now
from trainwarden.events import Event, InstanceExited, InstanceStarted, LogLine, Stream
from trainwarden.runtime.escapees import kill_incarnations
from trainwarden.runtime.keeper import MARK_VARIABLE
from trainwarden.runtime.keeper_lease import KeeperLease, KeeperUnavailable, KeptInstance, KeptProcess
from trainwarden.runtime.run_as import RunAs
from trainwarden.runtime.standby import python_invocation
from trainwarden.runtime.standby_pool import StandbyPool
from trainwarden.runtime.stopping import signal_group

MAX_LINE_BYTES = 16 * 1024
POLL_S = 0.05
# Passes over /proc for the escaped descendants of instances that ended by
# themselves come at most this often; the exits come in meanwhile are swept
# together. A pass lists every process on the machine and reads those new
# since the last (runtime/escapees.py): one per reaping turn took a quarter
# of an agent's CPU while a 1,024-wide job's instances ended one after
# another (bench/scale.py).
SWEEP_SPACING_S = 0.25
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
TRUNCATED = " …[line truncated]"
# Exit code of an instance that the supervisor could not start for want of
# resources (file descriptors, memory, processes): not the command's fault.
SUPERVISOR_EXIT_CODE = 125
_SUPERVISOR_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN)


@dataclasses.dataclass
class _Pipe:
    name: str
    stream: Stream
    fd: int
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    discarding: bool = False  # inside an over-long line, dropping bytes until its end


@dataclasses.dataclass
class _Proc:
    name: str
    popen: subprocess.Popen  # or KeptProcess: the keeper started it
    round: int
    start: int
    pipes: list
    mark: str = ""  # MARK_VARIABLE of this incarnation: finds descendants that left the group
    registered: bool = False  # its pipes are in the selector: only then may it be reaped
    stopping: bool = False
    gone: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class RuntimeCounters:
    lines: int = 0
    truncated_lines: int = 0
    non_utf8_lines: int = 0
    stale_lines_dropped: int = 0  # lines of an instance being stopped, while the inbox was full
    io_errors: int = 0
    escaped_processes_killed: int = 0
    unkept_starts: int = 0  # started here, not by the keeper (it was gone or the start too large): end with the agent


class LocalRuntime:
    def __init__(self, job_id: str, sink: Callable[[Event], None], node: str,
                 max_line_bytes: int = MAX_LINE_BYTES,
                 line_sink: Optional[Callable[[Event, float], bool]] = None,
                 preload: Sequence[str] = (), say: Optional[Callable[[str], None]] = None,
                 run_as: Optional[RunAs] = None, mark: Optional[str] = None, linger_s: float = 0.0):
        """``preload``: modules a standby interpreter imports for each Python
        instance before it starts (runtime/standby.py); ``say`` tells the
        operator once why an instance started fresh instead; ``run_as``: the
        user the instances (and their standbys) run as (runtime/run_as.py);
        ``mark``: the mark of the runtime of a previous run of the agent whose
        instances this one takes back (``readopt``); ``linger_s``: after
        reading output, wait this long for more before looking again (a
        caller that hands lines on in batches anyway: one turn per line
        otherwise, 128 a second for 64 instances printing twice a second)."""
        self.job_id = job_id
        self.run_as = run_as
        self._credentials = run_as.popen_options() if run_as is not None else {}
        self.node = node
        self.max_line_bytes = max_line_bytes
        self.counters = RuntimeCounters()
        self._sink = sink
        # Lines may wait for room (back-pressure); starts and exits never do.
        self._line_sink = line_sink
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._to_register: list[_Proc] = []
        # Marks of incarnations that ended by themselves whose escaped
        # descendants are still to be swept, and when the next sweep may come.
        self._unswept: list[str] = []
        self._next_sweep = 0.0
        self._linger_s = linger_s
        self._closed = False
        # Each incarnation's environment carries MARK_VARIABLE=<runtime>-<n>:
        # the keeper finds everything this runtime started by the prefix,
        # stops and reaps find one incarnation's descendants by the value.
        self._mark = mark or secrets.token_hex(8)
        self._starts = itertools.count(1)  # next() is atomic: starts come from several threads
        self._keeper = KeeperLease(self._mark)
        # Warm interpreters for Python instances, when the job names modules to preload.
        self._standbys = StandbyPool(preload, spawn_argv=with_parent_death_signal, on_spawn=self._keeper.watch,
                                     say=say or _say, run_as=run_as) if preload else None
        self._thread = threading.Thread(target=self._io_loop, name="runtime-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ control

    def start(self, name: str, command: Sequence[str], env: dict, cwd: Optional[str],
              round_: int, start: int, keep: Optional[dict] = None) -> int:
        """``keep``: what a new run of the agent needs to take the instance
        back (the node host's); with it, and when the keeper starts this
        process's instances, the keeper starts it (runtime/keeper_lease.py)."""
        if self._unswept:
            self._sweep([])  # no incarnation starts beside the escapees of one that ended by itself
        mark = f"{self._mark}-{next(self._starts)}"
        env = {**env, MARK_VARIABLE: mark}
        if self.run_as is not None:
            env = self.run_as.environment(env, os.environ)
        try:
            resolved = _resolve(command, env, cwd)
            popen = self._from_standby(name, resolved, env, cwd)
            fds = None
            if popen is None and keep is not None and self._keeper.spawns:
                popen, fds = self._kept(name, resolved, env, cwd, round_, start, mark, keep)
            if popen is None:
                popen = subprocess.Popen(
                    with_parent_death_signal(resolved), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **self._credentials,
                )
                self._keeper.watch(popen.pid)  # its own session: pid = process group = session id
        except OSError as exc:
            self._could_not_start(name, command, exc, round_, start)
            return 0
        if fds is None:
            fds = []
            for handle in (popen.stdout, popen.stderr):
                fds.append(os.dup(handle.fileno()))
                handle.close()
        pipes = []
        for stream, fd in zip((Stream.STDOUT, Stream.STDERR), fds):
            os.set_blocking(fd, False)
            pipes.append(_Pipe(name, stream, fd))
        proc = _Proc(name, popen, round_, start, pipes, mark=mark)
        # Started is sent before the I/O thread can see the process, so no
        # line or exit of it can overtake it.
        self._sink(InstanceStarted(job_id=self.job_id, time=now(), instance=name, round=round_,
                                   start=start, node=self.node, pid=popen.pid))
        with self._lock:
            self._procs[name] = proc
            self._to_register.append(proc)
        os.write(self._wake_w, b"x")
        return popen.pid

    def _kept(self, name: str, argv: list[str], env: dict, cwd: Optional[str], round_: int, start: int, mark: str,
              keep: dict) -> tuple[Optional[KeptProcess], Optional[list[int]]]:
        """The instance started by the keeper, or (None, None): start it here."""
        credentials = self._credentials
        try:
            popen, out_fd, err_fd = self._keeper.spawn(
                with_parent_death_signal(argv), env, cwd, credentials.get("user"), credentials.get("group"),
                {**keep, "instance": name, "round": round_, "start": start, "incarnation_mark": mark})
        except KeeperUnavailable as exc:
            self.counters.unkept_starts += 1
            if self.counters.unkept_starts == 1:
                print(f"trainwarden: started {name} without the keeper ({exc}); it ends with this agent",
                      file=sys.stderr)
            return None, None
        return popen, [out_fd, err_fd]

    def readopt(self, kept: KeptInstance) -> None:
        """An instance the keeper kept for a previous run of the agent, and its
        pipes: followed, stopped and reaped here from now on."""
        name, round_, start, mark = (kept.keep["instance"], kept.keep["round"], kept.keep["start"],
                                     kept.keep["incarnation_mark"])
        # New incarnations' marks must not repeat the kept ones'.
        number = int(mark.rsplit("-", 1)[1])
        self._starts = itertools.count(max(number + 1, next(self._starts)))
        popen = KeptProcess(kept.pid, self._keeper.link)
        pipes = [_Pipe(name, stream, fd) for stream, fd in ((Stream.STDOUT, kept.stdout), (Stream.STDERR, kept.stderr))]
        proc = _Proc(name, popen, round_, start, pipes, mark=mark)
        with self._lock:
            self._procs[name] = proc
            self._to_register.append(proc)
        os.write(self._wake_w, b"x")

    def _from_standby(self, name: str, argv: list[str], env: dict, cwd: Optional[str]) -> Optional[subprocess.Popen]:
        """A warm standby become this instance (``preload``), or None: start it fresh."""
        if self._standbys is None:
            return None
        invocation, why = python_invocation(argv)
        if invocation is None:
            self._standbys.fresh(why)
            return None
        standby = self._standbys.take(name, invocation, env, cwd, MARK_VARIABLE, f"{self._mark}-standby")
        if standby is None:
            return None
        # Watched by the keeper since it was spawned.
        standby.hand_over(invocation, env, cwd)
        return standby.popen

    def _could_not_start(self, name: str, command: Sequence[str], exc: OSError, round_: int, start: int) -> None:
        """Report it the way a shell would: the instance ran and exited 127
        (not found) or 126 (not executable), with the reason as its output;
        125 when this machine lacked the resources to start it."""
        moment = now()
        if exc.errno in _SUPERVISOR_ERRNOS:
            code, text = SUPERVISOR_EXIT_CODE, f"trainwarden could not start {command[0]!r}: {exc.strerror}"
        else:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            text = f"trainwarden: cannot start {command[0]!r}: {exc.strerror}"
        self._sink(InstanceStarted(job_id=self.job_id, time=moment, instance=name, round=round_, start=start,
                                   node=self.node, pid=0))
        self._sink(LogLine(job_id=self.job_id, time=moment, instance=name, round=round_, start=start,
                           text=text, stream=Stream.STDERR))
        self._sink(InstanceExited(job_id=self.job_id, time=moment, instance=name, round=round_, start=start,
                                  exit_code=code))

    def running(self) -> list[str]:
        with self._lock:
            return list(self._procs)

    def pid(self, name: str) -> Optional[int]:
        with self._lock:
            proc = self._procs.get(name)
        return proc.popen.pid if proc else None

    def stop(self, names: Sequence[str], grace_s: float,
             incarnations: Optional[dict[str, tuple[int, int]]] = None) -> None:
        """SIGTERM the instances' process groups, SIGKILL what is left after the
        grace period, and return once every one of them is gone. With
        ``incarnations`` (name -> (round, start)), only those: a stop meant
        for an old incarnation must never hit the one that replaced it."""
        with self._lock:
            procs = [self._procs[n] for n in names if n in self._procs]
        if incarnations is not None:
            procs = [p for p in procs if incarnations.get(p.name) == (p.round, p.start)]
        for proc in procs:
            proc.stopping = True
            signal_group(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            proc.gone.wait(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if not proc.gone.is_set():
                signal_group(proc.popen.pid, signal.SIGKILL)
        for proc in procs:
            proc.gone.wait(10.0)
        self._sweep([proc.mark for proc in procs])

    def kill(self, names: Sequence[str]) -> None:
        """SIGKILL the instances now (no grace) and return once they are gone."""
        with self._lock:
            procs = [self._procs[n] for n in names if n in self._procs]
        for proc in procs:
            proc.stopping = True
            signal_group(proc.popen.pid, signal.SIGKILL)
        for proc in procs:
            proc.gone.wait(10.0)
        self._sweep([proc.mark for proc in procs])

    def kill_all(self) -> None:
        """SIGKILL every instance now, without waiting (a second interrupt)."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            proc.stopping = True
            signal_group(proc.popen.pid, signal.SIGKILL)
        self._sweep([proc.mark for proc in procs])

    def stop_all(self, grace_s: float) -> None:
        self.stop(self.running(), grace_s)

    def close(self, grace_s: float = 5.0) -> None:
        self.stop_all(grace_s)
        if self._standbys is not None:
            self._standbys.close()
        self._keeper.close()
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # ------------------------------------------------------------ I/O thread

    def _io_loop(self) -> None:
        while not self._closed:
            try:
                self._io_once()
            except Exception as exc:  # noqa: BLE001 - this thread must outlive any one bad iteration
                self.counters.io_errors += 1
                if self.counters.io_errors == 1:
                    print(f"trainwarden: output reader error (continuing): {exc!r}", file=sys.stderr)
                time.sleep(POLL_S)

    def _io_once(self) -> None:
        with self._lock:
            pending, self._to_register = self._to_register, []
        for proc in pending:
            for pipe in proc.pipes:
                if pipe.fd >= 0:
                    self._selector.register(pipe.fd, selectors.EVENT_READ, pipe)
            proc.registered = True
        read = False
        for key, _ in self._selector.select(POLL_S):
            if key.data is None:
                _drain_wake(self._wake_r)
                continue
            self._read(key.data)
            read = True
        self._reap()
        if read and self._linger_s > 0:
            # A start or a close still wakes us at once.
            select.select([self._wake_r], [], [], self._linger_s)

    def _read(self, pipe: _Pipe) -> bool:
        """Read what is there; False once the pipe is closed."""
        while pipe.fd >= 0:
            try:
                chunk = os.read(pipe.fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                self._flush(pipe)
                self._unregister(pipe)
                return False
            self._feed(pipe, chunk)
            if len(chunk) < 65536:
                return True
        return False

    def _feed(self, pipe: _Pipe, chunk: bytes) -> None:
        pipe.buffer += chunk
        parts = _LINE_BREAK.split(bytes(pipe.buffer))
        pipe.buffer = bytearray(parts.pop())
        for part in parts:
            if pipe.discarding:
                pipe.discarding = False  # the end of the over-long line
                continue
            if len(part) > self.max_line_bytes:
                self.counters.truncated_lines += 1
                self._emit(pipe, part[: self.max_line_bytes], truncated=True)
            else:
                self._emit(pipe, part)
        if len(pipe.buffer) > self.max_line_bytes:
            if not pipe.discarding:
                self.counters.truncated_lines += 1
                self._emit(pipe, bytes(pipe.buffer[: self.max_line_bytes]), truncated=True)
            pipe.discarding = True
            pipe.buffer.clear()

    def _flush(self, pipe: _Pipe) -> None:
        if pipe.buffer and not pipe.discarding:
            self._emit(pipe, bytes(pipe.buffer))
        pipe.buffer.clear()

    def _emit(self, pipe: _Pipe, raw: bytes, truncated: bool = False) -> None:
        proc = self._procs.get(pipe.name)
        if proc is None:
            return
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            self.counters.non_utf8_lines += 1
        if truncated:
            text += TRUNCATED
        self.counters.lines += 1
        line = LogLine(job_id=self.job_id, time=now(), instance=pipe.name, round=proc.round,
                       start=proc.start, text=text, stream=pipe.stream)
        if self._line_sink is None:
            self._sink(line)
            return
        while not self._line_sink(line, 0.0 if proc.stopping else 0.2):
            # The engine already ignores lines of an incarnation being
            # stopped; waiting for room for them would stall the stop itself.
            if proc.stopping or self._closed:
                self.counters.stale_lines_dropped += 1
                return

    def _unregister(self, pipe: _Pipe) -> None:
        try:
            self._selector.unregister(pipe.fd)
        except (KeyError, ValueError):
            pass
        try:
            os.close(pipe.fd)
        except OSError:
            pass
        pipe.fd = -1

    def _reap(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
        ended = []
        for proc in procs:
            if not proc.registered:
                continue  # its pipes are not being read yet; reap it next time
            code = proc.popen.poll()
            if code is None:
                continue
            # Read what the process wrote before it died, but do not wait for
            # pipes that orphaned children still hold open.
            for pipe in proc.pipes:
                if pipe.fd >= 0:
                    self._read(pipe)
                    self._flush(pipe)
                    self._unregister(pipe)
            # Children left behind by a dead instance are orphans: end them,
            # including those that started a session of their own.
            signal_group(proc.popen.pid, signal.SIGKILL)
            ended.append((proc, code))
        # Stopped ones are left to their stop, which makes one pass for all of
        # them once they are gone (a stopped round's exits come over several
        # turns). Those that ended by themselves are swept together, the first
        # after a quiet spell at once, the rest within SWEEP_SPACING_S: their
        # exits are handed out meanwhile, but any stop or close of this job
        # sweeps what is left before it returns, so an incarnation that
        # follows on this node never starts beside them.
        with self._lock:
            self._unswept.extend(proc.mark for proc, _ in ended if not proc.stopping)
        if self._unswept and time.monotonic() >= self._next_sweep:
            self._sweep([])
        for proc, code in ended:
            self._keeper.forget(proc.popen.pid)
            if isinstance(proc.popen, KeptProcess):
                proc.popen.forget()
            exit_code = 128 - code if code < 0 else code
            self._sink(InstanceExited(job_id=self.job_id, time=now(), instance=proc.name,
                                      round=proc.round, start=proc.start, exit_code=exit_code))
            with self._lock:
                if self._procs.get(proc.name) is proc:
                    del self._procs[proc.name]
            proc.gone.set()


    def _sweep(self, marks: list[str]) -> None:
        """One pass over /proc for these incarnations and those not swept yet."""
        with self._lock:
            marks, self._unswept = [*marks, *self._unswept], []
        if marks:
            self.counters.escaped_processes_killed += kill_incarnations(marks)
            self._next_sweep = time.monotonic() + SWEEP_SPACING_S


_SETPRIV = shutil.which("setpriv")


def _say(text: str) -> None:
    print(f"trainwarden: {text}", file=sys.stderr)


def _resolve(command: Sequence[str], env: dict, cwd: Optional[str]) -> list[str]:
    """The command with its program found as exec would find it, so that a
    missing program is reported as ours (127) and not as setpriv's."""
    program = command[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd or os.getcwd(), program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return list(command)
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return [found, *command[1:]]


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """The instance gets SIGKILL if its supervisor dies, even by SIGKILL, so
    that no job outlives trainwarden or a node agent (util-linux setpriv).
    Linux sends it when the *thread* that forked the child ends: instances
    must be started from a thread that lives as long as the supervisor."""
    if _SETPRIV is None:
        return argv
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def kill_incarnation(mark: str) -> int:
    return kill_incarnations((mark,))


def _drain_wake(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
