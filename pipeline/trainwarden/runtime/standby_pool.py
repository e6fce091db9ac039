"""The runtime's side of pre-warmed interpreters (runtime/standby.py): for
each interpreter and job environment it keeps standbys that have imported
the job's ``preload`` modules, hands one to each instance that starts, and
prepares its replacement in the background.

What the instances import lazily under the preload packages (``torch``
leaves ``torch._dynamo`` to the first optimizer) is learned from them
(standby.learn_imports) and sent to the waiting standbys, and to each new
one, so that ``--preload torch`` covers what the job uses of torch.

Standbys are never instances: they are in no hang detection, history or
placement, and they are stopped with the runtime. Every one is started from
the pool's own thread, which lives as long as the runtime: Linux sends the
parent-death signal when the *thread* that forked a process ends.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import queue
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Optional, Sequence

from trainwarden.runtime.run_as import RunAs
from trainwarden.runtime.standby import Invocation, is_module_name
from trainwarden.runtime.stopping import signal_group

STANDBY_SCRIPT = str(Path(__file__).resolve().parent / "standby.py")
CONTROL_PIPE_BYTES = 1 << 20  # what the pool may write before the standby reads: its imports, then its instance
LEARNED_MAX = 20_000  # modules learned per job environment
LEARN_BYTES_MAX = 4 << 20
REFRESH_EVERY_S = 1.0
# Spares are prepared this long after the last start: a round's own imports
# come first (on 2 cores, three spares importing torch beside three starting
# ranks kept them silent long enough to look hung).
SPARES_AFTER_S = 5.0
# ... and this long after the instances last loaded a module under the
# preload packages: until then they are still starting (torch._dynamo's 900
# modules come with the first optimizer), and on 2 cores even spares on idle
# CPU slowed that down.
SPARES_AFTER_LEARNING_S = 3.0
# An instance's own variables: a standby starts before any instance exists.
INSTANCE_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TRAINWARDEN_INSTANCE", "TRAINWARDEN_ROLE",
    "TRAINWARDEN_RESTART_ROUND", "TRAINWARDEN_INSTANCE_RESTARTS", "TRAINWARDEN_RESUME", "TRAINWARDEN_SDK_SOCKET",
    "TRAINWARDEN_TOKEN",
})


@dataclasses.dataclass
class Standby:
    popen: subprocess.Popen
    control: int  # write end: its imports, then the instance's description; a socket in streams mode
    ready: int  # read end: b"R" once the modules are imported
    key: str
    warm: bool = False
    failure: str = ""  # why its preload failed, as it said
    learned_sent: int = 0  # how many of its key's learned modules it was told to import
    learn: str = ""  # where its instance appends the modules it loads under ``roots``
    roots: tuple[str, ...] = ()
    # The pool's spawner reads ``ready`` of a handed-over standby while its
    # runtime may close it: one at a time, so a closed (or reused) fd number
    # is never selected or read.
    fds_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def is_ready(self) -> Optional[bool]:
        """True once warm; False if it died or its preload failed; None while
        still importing."""
        if self.warm:
            return self.popen.poll() is None
        if self.failure:
            return False
        if not _readable_now(self.ready):
            return None if self.popen.poll() is None else False
        try:
            said = os.read(self.ready, 1024)
        except OSError:
            said = b""
        self.warm = said == b"R"
        if said.startswith(b"F "):
            self.failure = said[2:].decode("utf-8", "replace")
        return self.warm and self.popen.poll() is None

    def send_imports(self, names: Sequence[str]) -> None:
        if names and self.control >= 0:
            try:
                _write_all(self.control, (json.dumps({"import": list(names)}) + "\n").encode())
            except OSError:
                pass  # it died: found out when it is next chosen
            self.learned_sent += len(names)

    def hand_over(self, invocation: Invocation, env: dict, cwd: Optional[str], streams: Sequence[int] = ()) -> None:
        """``streams``: the instance's stdin, stdout and stderr (a pool in
        streams mode), else it keeps the pipes it was started with."""
        message = {"invocation": dataclasses.asdict(invocation), "env": env, "cwd": cwd or "", "learn": self.learn,
                   "roots": list(self.roots)}
        data = (json.dumps({"become": message}) + "\n").encode()
        try:
            if streams:
                # The instance's stdin, stdout and stderr go with the first byte;
                # the rest follows on the same blocking stream.
                with socket.socket(fileno=os.dup(self.control)) as sock:
                    socket.send_fds(sock, [data[:1]], list(streams))
                    sock.sendall(data[1:])
            else:
                os.write(self.control, data)  # a blocking fd: a long environment is written whole
        finally:
            # The ready pipe stays: a standby handed over while still importing
            # says there how its preload went (StandbyPool._check_handed).
            _close(self.control)
            self.control = -1

    def preload_outcome(self) -> Optional[str]:
        """After hand-over, without touching the process (the runtime waits
        for it): "" once its preload went well or it said nothing before it
        ended, the failure it said, or None while it is still importing."""
        with self.fds_lock:
            if self.ready < 0:
                return ""
            if not _readable_now(self.ready):
                return None
            try:
                said = os.read(self.ready, 1024)
            except OSError:
                said = b""
            _close(self.ready)
            self.ready = -1
        return said[2:].decode("utf-8", "replace") if said.startswith(b"F ") else ""

    def discard_fds(self) -> None:
        with self.fds_lock:
            for fd in (self.control, self.ready):
                _close(fd)
            self.control = self.ready = -1

    def close(self) -> None:
        """Its control pipe ends: a standby that is still waiting exits by itself."""
        self.discard_fds()
        try:
            self.popen.wait(2.0)
        except subprocess.TimeoutExpired:
            signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5.0)
        for handle in (self.popen.stdout, self.popen.stderr):
            if handle is not None:
                handle.close()


def standby_env(env: dict, mark_variable: str, mark: str) -> dict:
    """The job's environment without any one instance's variables."""
    clean = {k: v for k, v in env.items() if k not in INSTANCE_VARIABLES}
    clean[mark_variable] = mark
    return clean


def env_key(interpreter: str, env: dict, cwd: Optional[str], modules: Sequence[str], mark_variable: str) -> str:
    """Standbys of one key are interchangeable: same interpreter, modules,
    working directory and job environment."""
    shared = sorted((k, v) for k, v in env.items() if k not in INSTANCE_VARIABLES and k != mark_variable)
    text = json.dumps([interpreter, list(modules), cwd or "", shared])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StandbyPool:
    def __init__(self, modules: Sequence[str], spawn_argv: Callable[[list[str]], list[str]],
                 on_spawn: Callable[[int], None], say: Callable[[str], None], streams: bool = False,
                 spares_after_s: float = SPARES_AFTER_S, spares_after_learning_s: float = SPARES_AFTER_LEARNING_S,
                 run_as: Optional[RunAs] = None):
        """``spawn_argv`` wraps a standby's command as instances' are (parent
        death signal); ``on_spawn(pid)`` tells the keeper; ``say`` reports a
        fallback to an ordinary start, once per reason. ``streams``: each
        instance brings its stdin, stdout and stderr (``Standby.hand_over``),
        so the standbys' control channels are Unix sockets and their output
        before that goes nowhere. ``spares_after_s``: how long after the
        last start spares are prepared and told what was learned, and
        ``spares_after_learning_s`` how long after the last module learned.
        ``run_as``: the user the standbys (the instances to be) run as."""
        self.modules = tuple(modules)
        self._spares_after_s = spares_after_s
        self._spares_after_learning_s = spares_after_learning_s
        self._quiet_from = 0.0  # time.monotonic() from which background work may start
        self.streams = streams
        self._spawn_argv = spawn_argv
        self._on_spawn = on_spawn
        self._say = say
        self._said: set[str] = set()
        self._idle: dict[str, list[Standby]] = {}
        self._instances: dict[str, set[str]] = {}  # key -> the instances that started with it: one spare each
        self._pending: dict[str, int] = {}  # key -> spawns asked for, not yet kept
        self._broken: dict[str, str] = {}  # key -> why its preload failed: ordinary starts from then on
        self._handed: list[Standby] = []  # handed over before their preload said how it went
        self._lock = threading.Lock()
        self._jobs: "queue.SimpleQueue[Optional[tuple[Future, str, dict, Optional[str], str, bool]]]" = \
            queue.SimpleQueue()
        self._closed = False
        self.roots = tuple(sorted({name.partition(".")[0] for name in self.modules}))
        self._learn_dir = tempfile.mkdtemp(prefix="trainwarden-learned-")
        self._credentials = run_as.popen_options() if run_as is not None else {}
        if run_as is not None:
            run_as.give(Path(self._learn_dir))  # the instances append what they load there
        self._learned: dict[str, list[str]] = {}  # key -> modules its instances loaded under the roots, in order
        self._learn_read: dict[str, int] = {}  # key -> bytes of its learn file read so far
        self.counters = {"taken": 0, "fresh_starts": 0, "spawned": 0, "died": 0, "learned": 0}
        self._thread = threading.Thread(target=self._spawner, name="standby-spawner", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ instances

    def take(self, instance: str, invocation: Invocation, env: dict, cwd: Optional[str], mark_variable: str,
             mark: str) -> Optional[Standby]:
        """A standby for this instance (a warm one first, else one still
        importing, which reads its instance once its imports are done), with
        the pool topped up to one spare per instance of this key in the
        background; or None (said once per reason): the instance starts fresh.
        Never waits for imports: the instances of a round start together."""
        key = env_key(invocation.interpreter, env, cwd, self.modules, mark_variable)
        spare_env = standby_env(env, mark_variable, mark)
        with self._lock:
            self._check_handed()
            if key in self._broken:
                self.counters["fresh_starts"] += 1
                return None
            self._instances.setdefault(key, set()).add(instance)
            self._quiet_from = time.monotonic() + self._spares_after_s
            chosen = self._choose(key)
        if chosen is None:  # none spare: one now
            chosen = self._spawn(invocation.interpreter, spare_env, cwd, key).result()
        self._top_up(invocation.interpreter, spare_env, cwd, key)
        if chosen is None:
            self.counters["fresh_starts"] += 1
            return None
        self.counters["taken"] += 1
        if not chosen.warm:
            with self._lock:
                self._handed.append(chosen)
        return chosen

    def _check_handed(self) -> None:
        """A preload that failed in a standby handed over while importing
        breaks its key as one that failed while idle does (the lock is held)."""
        for standby in list(self._handed):
            outcome = standby.preload_outcome()
            if outcome is None:
                continue
            self._handed.remove(standby)
            # Its instance starts only now: the spares wait for that start as for any other.
            self._quiet_from = max(self._quiet_from, time.monotonic() + self._spares_after_s)
            if outcome:
                self._broken[standby.key] = outcome
                self._once(f"{outcome}; instances start as ordinary processes")

    def learn_path(self, key: str) -> str:
        """Where the instances of this key append the modules they load (``Standby.learn``)."""
        return os.path.join(self._learn_dir, key + ".modules")

    # ------------------------------------------------------------ learning

    def _learn(self) -> None:
        """Read what the instances loaded since last time; while they still
        load modules, they are starting, and spares wait."""
        with self._lock:
            keys = list(self._instances)
        if sum(self._read_learned(key) for key in keys):
            with self._lock:
                self._quiet_from = max(self._quiet_from, time.monotonic() + self._spares_after_learning_s)

    def _refresh(self) -> None:
        """Tell the idle standbys of each key to import what was learned (the spawner's thread)."""
        with self._lock:
            for key, idle in self._idle.items():
                learned = self._learned.get(key, [])
                for standby in idle:
                    if standby.learned_sent < len(learned):
                        standby.send_imports(learned[standby.learned_sent:])

    def _read_learned(self, key: str) -> int:
        """How many new modules this key's learn file names."""
        path = self.learn_path(key)
        done = self._learn_read.get(key, 0)
        try:
            # The job may own the directory (run as another user): never
            # follow its link, or block on its FIFO, in place of the file.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return 0
            os.lseek(fd, done, os.SEEK_SET)
            data = os.read(fd, max(0, LEARN_BYTES_MAX - done))
        except OSError:
            return 0
        finally:
            os.close(fd)
        complete = data.rpartition(b"\n")[0]
        if not complete:
            return 0
        self._learn_read[key] = done + len(complete) + 1
        learned = self._learned.setdefault(key, [])
        known = set(learned)
        added = 0
        # The job wrote this file: only module names under the preload
        # packages, never a __main__, and a bounded number of them.
        for raw in complete.split(b"\n"):
            name = raw.decode("utf-8", "replace").strip()
            if (name in known or not is_module_name(name) or name.partition(".")[0] not in self.roots
                    or name.rpartition(".")[2] == "__main__" or len(learned) >= LEARNED_MAX):
                continue
            known.add(name)
            learned.append(name)
            self.counters["learned"] += 1
            added += 1
        return added

    def _choose(self, key: str) -> Optional[Standby]:
        idle = self._idle.get(key, [])
        states = [(standby, standby.is_ready()) for standby in idle]
        for standby, state in states:
            if state is False:
                idle.remove(standby)
                self._lost(standby)
        if key in self._broken:
            return None
        for wanted in (True, None):
            for standby, state in states:
                if state is wanted and standby in idle:
                    idle.remove(standby)
                    return standby
        return None

    def _top_up(self, interpreter: str, env: dict, cwd: Optional[str], key: str) -> None:
        with self._lock:
            missing = len(self._instances.get(key, ())) - len(self._idle.get(key, ())) - self._pending.get(key, 0)
            if key in self._broken or missing <= 0:
                return
            self._pending[key] = self._pending.get(key, 0) + missing
        for _ in range(missing):
            self._spawn_later(interpreter, env, cwd, key)

    def _lost(self, standby: Standby) -> None:
        """A standby that died or could not preload (the pool's lock is held)."""
        self.counters["died"] += 1
        if standby.failure:
            self._broken[standby.key] = standby.failure
            self._once(f"{standby.failure}; instances start as ordinary processes")
        else:
            self._once(f"a standby interpreter {_last_words(standby)}; it is replaced")
        standby.close()

    def fresh(self, reason: str) -> None:
        self.counters["fresh_starts"] += 1
        self._once(f"--preload: {reason}; this instance starts as an ordinary process")

    def _once(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self._say(text)

    # ------------------------------------------------------------ spawning

    def _spawn(self, interpreter: str, env: dict, cwd: Optional[str], key: str, spare: bool = False) -> Future:
        """A standby now (an instance waits for it), or a ``spare`` once the
        starts have been quiet for ``spares_after_s``."""
        future: Future = Future()
        if self._closed:
            future.set_result(None)
        else:
            self._jobs.put((future, interpreter, env, cwd, key, spare))
        return future

    def _spawn_later(self, interpreter: str, env: dict, cwd: Optional[str], key: str) -> None:
        future = self._spawn(interpreter, env, cwd, key, spare=True)
        future.add_done_callback(lambda done: self._keep(done.result(), key))

    def _keep(self, standby: Optional[Standby], key: str) -> None:
        with self._lock:
            self._pending[key] = max(0, self._pending.get(key, 0) - 1)
            if standby is None:
                return
            if self._closed:
                standby.close()
                return
            self._idle.setdefault(standby.key, []).append(standby)

    def _spawner(self) -> None:
        spares: list = []  # spare spawns waiting for quiet
        while True:
            self._learn()
            with self._lock:
                self._check_handed()
                importing = bool(self._handed)  # an instance still waits for its standby's imports
            quiet_in = self._quiet_from - time.monotonic()
            if importing:
                quiet_in = max(quiet_in, REFRESH_EVERY_S)
            if spares and quiet_in <= 0:
                job = spares.pop(0)
            else:
                try:
                    job = self._jobs.get(timeout=min(REFRESH_EVERY_S, quiet_in) if quiet_in > 0 else REFRESH_EVERY_S)
                except queue.Empty:
                    if not importing and self._quiet_from <= time.monotonic():
                        self._refresh()
                    continue
                if job is None:
                    for future, *_ in spares:
                        future.set_result(None)
                    return
                if job[5] and (spares or importing or self._quiet_from > time.monotonic()):
                    spares.append(job)
                    continue
            future, interpreter, env, cwd, key, _ = job
            try:
                standby = self._start(interpreter, env, cwd, key)
                standby.send_imports(list(self._learned.get(key, ())))
                future.set_result(standby)
            except OSError as exc:
                self._once(f"a standby interpreter could not start ({exc.strerror}); instances start as ordinary "
                           f"processes")
                future.set_result(None)

    def _start(self, interpreter: str, env: dict, cwd: Optional[str], key: str) -> Standby:
        if self.streams:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            control_w, control_r = ours.detach(), theirs.detach()
            output = subprocess.DEVNULL
        else:
            control_r, control_w = os.pipe()
            output = subprocess.PIPE
            try:
                fcntl.fcntl(control_w, fcntl.F_SETPIPE_SZ, CONTROL_PIPE_BYTES)
            except OSError:
                pass  # above /proc/sys/fs/pipe-max-size: the default size, and a write may wait for the standby
        ready_r, ready_w = os.pipe()
        try:
            popen = subprocess.Popen(
                self._spawn_argv([interpreter, STANDBY_SCRIPT, str(control_r), str(ready_w), *self.modules]),
                env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=(control_r, ready_w), **self._credentials)
        except OSError:
            for fd in (control_r, control_w, ready_r, ready_w):
                os.close(fd)
            raise
        os.close(control_r)
        os.close(ready_w)
        self._on_spawn(popen.pid)
        self.counters["spawned"] += 1
        return Standby(popen, control_w, ready_r, key, learn=self.learn_path(key), roots=self.roots)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [s for group in self._idle.values() for s in group]
            self._idle.clear()
            for standby in idle:  # a failed preload is said even if no later start met it
                if standby.is_ready() is False and standby.failure:
                    self._once(f"{standby.failure}; instances start as ordinary processes")
            self._check_handed()
            for standby in self._handed:
                standby.discard_fds()
            self._handed.clear()
        self._jobs.put(None)
        self._thread.join(10.0)
        for standby in idle:
            standby.close()
        shutil.rmtree(self._learn_dir, ignore_errors=True)

    def idle_pids(self) -> list[int]:
        with self._lock:
            return [s.popen.pid for group in self._idle.values() for s in group]


def _last_words(standby: Standby) -> str:
    """What a standby that died said on stderr (its preload error)."""
    try:
        standby.popen.wait(1.0)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    text = ""
    if standby.popen.stderr is not None:
        os.set_blocking(standby.popen.stderr.fileno(), False)
        try:
            text = (standby.popen.stderr.read() or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
            text = text[0] if text else ""
        except (OSError, TypeError):
            text = ""
    code = standby.popen.returncode
    return f"exited with code {code}" + (f" ({text[:300]})" if text else "")


def _readable_now(fd: int) -> bool:
    """poll, not select: a busy process (an agent with many jobs, a test
    session) has descriptors past select's 1024 limit."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
