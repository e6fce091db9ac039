"""The node host: everything one machine does for the incarnations on it,
whichever engine placed them there.

Start (a token from the SDK endpoint, the environment, the process, its pid
bound to the token); stop one incarnation at a time (marked stopping, its
stacks dumped first when asked, SIGTERM, the grace period, SIGKILL of its
tree); adopt a process another engine started, once that engine's adopter
proves it (``runtime/adoption.py``); follow what they print (a tail per
incarnation, batches, the instance log files) and hand starts, batches and
exits with their tails to its output; warm standbys (``preload``, through
each job's ``LocalRuntime``).

``trainwarden run`` (runtime/launcher.py) drives one with the engine in the
same process: every event goes straight to its sink. A node agent
(services/agent.py) drives one from the bus and lets it follow the output
(``follows_output``): events come back through ``take`` and leave through
``HostOutput``.

Commands may arrive late and out of order (the bus, a new actuator finishing
its predecessor's work): an incarnation runs once, never after a newer one
of its instance or a stop of it; a start waits (held) while a stop of its
instance is under way, so that the stack dump sees the old incarnation
alive.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, Sequence

from trainwarden.clock import now as clock_now
from trainwarden.events import Event, InstanceExited, InstanceSpec, InstanceStarted, LogLine
from trainwarden.runtime.adoption import Adopted, Adopter, AdopterFactory, Launch, Stopped
from trainwarden.runtime.control import ControlServer, Incarnation
from trainwarden.runtime.environment import instance_env, sdk_import_dir
from trainwarden.runtime.keeper_lease import KeptInstance
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.logfiles import InstanceFiles, LogFileLimits
from trainwarden.runtime.run_as import RunAs, share_sdk_path
from trainwarden.runtime.stopping import dump_stacks

TAIL_LINES = 500
BATCH_LINES = 500
# The stop of an older incarnation still running when a newer one starts.
REPLACED_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class StartOrder:
    """Start this incarnation of an instance here."""

    job_id: str
    spec: InstanceSpec
    command: tuple[str, ...]
    round: int
    start: int
    world_size: int
    max_restarts: int
    master_addr: str
    master_port: int
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the job's own variables
    workdir: Optional[str] = None
    preload: tuple[str, ...] = ()  # modules its standby imports (runtime/standby.py)


@dataclasses.dataclass(frozen=True)
class StopOrder:
    """Stop these instances of a job here."""

    job_id: str
    grace_s: float
    names: tuple[str, ...] = ()  # empty: every instance of the job here
    # name -> (round, start): exactly those incarnations; None: the current ones.
    incarnations: Optional[Mapping[str, tuple[int, int]]] = None
    report_id: str = ""  # dump their stacks first, for this report
    job_ended: bool = False  # its id may come again, as a new job


# What the node an incarnation lands on sets itself, when another engine
# places it there (a batch scheduler's task wrapper: torchrun's variables from its own,
# the node agent's SDK address).
NODE_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TRAINWARDEN_NODE", "TRAINWARDEN_CONTROL", "TRAINWARDEN_SDK_SOCKET")


def incarnation_env(order: StartOrder, token: str, sdk_path: str, *, base: Mapping[str, str],
                    control_address: str, node: str) -> dict[str, str]:
    """The environment of an incarnation, on every runtime: built here once."""
    return instance_env(
        base=base, job_id=order.job_id, spec=order.spec, world_size=order.world_size, round_=order.round,
        start=order.start, max_restarts=order.max_restarts, master_addr=order.master_addr,
        master_port=order.master_port, control_address=control_address, token=token, sdk_path=sdk_path,
        extra=dict(order.env), node=node)


def planned_env(order: StartOrder, token: str, sdk_path: str) -> dict[str, str]:
    """The environment of an incarnation another engine starts: all but
    ``NODE_VARIABLES``, which the node it lands on sets."""
    env = incarnation_env(order, token, sdk_path, base={}, control_address="", node="")
    for key in NODE_VARIABLES:
        env.pop(key, None)
    return env


@dataclasses.dataclass
class Running:
    """One incarnation on this machine, as followed."""

    job_id: str
    instance: str
    round: int
    start: int
    pid: int = 0
    token: str = ""
    last_output: float = 0.0
    tail: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    batch: list = dataclasses.field(default_factory=list)  # LogLines not yet handed out
    adopter: Optional[Adopter] = None  # the engine that started it, when adopted

    @property
    def incarnation(self) -> tuple[int, int]:
        return self.round, self.start


@dataclasses.dataclass
class HostCounters:
    starts: int = 0
    stops: int = 0
    ignored_commands: int = 0  # a start of an incarnation not newer than one seen, a stop of nothing
    held_starts_cancelled: int = 0  # a newer start or a stop came first: the held one never ran
    lines: int = 0
    log_rotations: int = 0  # instance output files rotated at their size limit (runtime/logfiles.py)
    log_lines_unwritten: int = 0  # lines left out of a full output file (still handed out and tailed)
    log_write_errors: int = 0  # output file writes that failed (a full disk)


class HostOutput(Protocol):
    """Where a node host that follows the output hands it."""

    def on_started(self, event: InstanceStarted) -> None: ...
    def on_lines(self, batches: list[tuple[Running, list[LogLine]]]) -> None:
        """Every incarnation's lines of one turn at once (so that a node
        ships one message per job, not one per instance), each list in order."""
    def on_exited(self, event: InstanceExited) -> None:
        """With the incarnation's last lines as its tail."""


@dataclasses.dataclass
class _Held:
    """A start waiting for stops of its instance to finish."""

    incarnation: tuple[int, int]
    token: str
    waits_for: list  # the stopper threads
    launch: Callable[[], None]


class NodeHost:
    def __init__(self, node: str, control: ControlServer, sink: Callable[[Event], None], sdk_dir: Path,
                 output: Optional[HostOutput] = None, line_sink: Optional[Callable[[Event, float], bool]] = None,
                 run_as: Optional[RunAs] = None, say: Optional[Callable[[str, str], None]] = None,
                 adopters: Sequence[AdopterFactory] = (), stack_tools: Sequence[str] = (),
                 stack_timeout_s: float = 0.0, log_dir: Optional[Path] = None,
                 log_limits: LogFileLimits = LogFileLimits(), counters: Optional[HostCounters] = None,
                 dumps_to: Optional[Callable[[str, str, list, list], None]] = None,
                 clock: Callable[[], float] = clock_now, line_linger_s: float = 0.0):
        """``sink``/``line_sink``: where each job's processes' events go
        (``runtime/local.py``); ``output``: set when this host follows the
        output itself (events come back through ``take``); ``say(job, text)``
        tells the operator why an instance started without its standby;
        ``log_dir``: the instance log files, when this host writes them;
        ``dumps_to(job, report, dumps, missing)``: where a stop's stack dumps go."""
        self.node = node
        self.line_linger_s = line_linger_s  # LocalRuntime's linger_s
        self.control = control
        self.run_as = run_as
        self.output = output
        self.clock = clock
        self.counters = counters if counters is not None else HostCounters()
        self.stack_tools = tuple(stack_tools)
        self.stack_timeout_s = stack_timeout_s
        self._sink = sink
        self._line_sink = line_sink
        self._say = say
        self._dumps_to = dumps_to
        self.sdk_path = sdk_import_dir(Path(sdk_dir))
        if run_as is not None:
            share_sdk_path(self.sdk_path)
        self.files = InstanceFiles(log_dir, log_limits, self.counters) if log_dir is not None else None
        self.adopters: list[Adopter] = [make(control.address) for make in adopters]
        self.runtimes: dict[str, LocalRuntime] = {}
        self.running: dict[tuple[str, str], Running] = {}
        # Incarnations being stopped while a newer one of the same instance
        # starts: what they print until they exit is still followed.
        self.retiring: dict[tuple[str, str, int, int], Running] = {}
        self._stoppers: list[threading.Thread] = []
        # At most one held start per (job, instance): the newest one asked for.
        self._held: dict[tuple[str, str], _Held] = {}
        self._stopping: dict[tuple[str, str], tuple[tuple[int, int], threading.Thread]] = {}
        # The newest incarnation of each (job, instance) started or stopped
        # here: a start of that one again, or of an older one, is ignored.
        self._newest: dict[tuple[str, str], tuple[int, int]] = {}
        self._ended: set[str] = set()  # jobs that are over: let go of once nothing of them runs here

    @property
    def follows_output(self) -> bool:
        return self.output is not None

    def runtime(self, job_id: str, preload: Sequence[str] = ()) -> LocalRuntime:
        """The job's processes here (created with its first start)."""
        runtime = self.runtimes.get(job_id)
        if runtime is None:
            say = self._say
            runtime = self.runtimes[job_id] = LocalRuntime(
                job_id, self._sink, self.node, line_sink=self._line_sink, preload=tuple(preload),
                run_as=self.run_as, say=(lambda text: say(job_id, text)) if say else None,
                linger_s=self.line_linger_s)
        return runtime

    # ------------------------------------------------------------ starting

    def start(self, order: StartOrder) -> bool:
        """Start the incarnation (now, or once a stop of its instance under
        way ends); False when it is not newer than one seen here."""
        self._ended.discard(order.job_id)  # the same id again: a new job
        key = (order.job_id, order.spec.name)
        incarnation = (order.round, order.start)
        newest = self._newest.get(key)
        if newest is not None and incarnation <= newest:
            self.counters.ignored_commands += 1
            return False
        self._newest[key] = incarnation
        waits_for = self._cancel_held(key)  # a held older start never runs; this one waits for what it waited for
        # Another engine's place runs it (a pod): handed over, not started here.
        launcher = next((adopter for adopter in self.adopters if adopter.claims(order.env)), None)
        runtime = self.runtime(order.job_id, order.preload) if launcher is None else None
        self._retire(key)
        inc = Incarnation(order.job_id, order.spec.name, order.round, order.start)
        token = self.control.issue_token(inc)
        if launcher is None:
            env = incarnation_env(order, token, self.sdk_path, base=os.environ, control_address=self.control.address,
                                  node=self.node)
        else:  # nothing of this machine's environment: the place has its own (the SDK's copy it mounts)
            env = incarnation_env(order, token, self.sdk_path, base={}, control_address=self.control.address,
                                  node=self.node)
        self.running[key] = Running(order.job_id, order.spec.name, order.round, order.start, token=token,
                                    last_output=self.clock(), adopter=launcher)
        self.counters.starts += 1
        under_way = self._stopping.get(key)
        if under_way is not None and under_way[1] not in waits_for:
            waits_for.append(under_way[1])
        waits_for = [thread for thread in waits_for if thread.is_alive()]

        def launch() -> None:
            if launcher is not None:
                launcher.launch(Launch(inc, token, tuple(order.command), env, order.workdir or ""))
                return
            # Whatever incarnation of the instance still runs here is older:
            # stopped first (the runtime keeps one process per instance, and
            # one it lost track of would outlive every stop).
            runtime.stop([order.spec.name], REPLACED_GRACE_S)
            pid = runtime.start(order.spec.name, order.command, env, order.workdir or None, order.round,
                                order.start, keep={"job_id": order.job_id, "token": token,
                                                   "control": self.control.address})
            self.control.bind(token, pid)
            running = self.running.get(key)
            if running is not None and running.token == token and not running.pid:
                running.pid = pid

        if waits_for:
            # Its stack dump must see the old incarnation alive. The start
            # waits, for this (the caller's) thread: an instance gets SIGKILL
            # when the thread that started it ends (parent-death signal).
            self._held[key] = _Held(incarnation, token, waits_for, launch)
        else:
            launch()
        return True

    def _retire(self, key: tuple[str, str]) -> None:
        current = self.running.get(key)
        if current is not None:
            if self.follows_output:
                self.retiring[(current.job_id, current.instance, current.round, current.start)] = current
            else:
                # Nothing follows its output here: it is just replaced.
                self.control.revoke(current.token)

    def _cancel_held(self, key: tuple[str, str]) -> list:
        """Drop the held start of this instance (it never ran); returns the stops it was waiting for."""
        held = self._held.pop(key, None)
        if held is None:
            return []
        entry = self.running.get(key)
        if entry is not None and entry.incarnation == held.incarnation:
            del self.running[key]
        self.control.revoke(held.token)
        self.counters.held_starts_cancelled += 1
        return list(held.waits_for)

    # ------------------------------------------------------------ adopting

    def expect(self, job_id: str, incarnations: Sequence[tuple[str, int, int, str]]) -> None:
        """The actuator announced incarnations another engine starts: each adopter may prove them."""
        for adopter in self.adopters:
            adopter.expect(job_id, incarnations)

    def adopt(self, adopted: Adopted, adopter: Adopter) -> None:
        """A process another engine started, proven to be this incarnation: ours from now on."""
        inc = adopted.incarnation
        key = (inc.job_id, inc.instance)
        current = self.running.get(key)
        if current is not None and current.token == adopted.token and current.adopter is adopter:
            # One it launched (``start``): its process is now proven.
            current.pid = adopted.pid
            self.control.bind(adopted.token, adopted.pid)
            return
        self._retire(key)
        self.control.accept_token(adopted.token, inc, adopted.pid)
        self.running[key] = Running(inc.job_id, inc.instance, inc.round, inc.start, pid=adopted.pid,
                                    token=adopted.token, last_output=self.clock(), adopter=adopter)
        self.counters.starts += 1

    def readopt(self, kept: Sequence[KeptInstance]) -> int:
        """Instances a previous run of this node's agent started, which its
        keeper kept (runtime/keeper_lease.py): followed here as if started
        here, their SDK tokens good again. How many."""
        taken = 0
        for item in kept:
            job_id, name = item.keep["job_id"], item.keep["instance"]
            incarnation = (item.keep["round"], item.keep["start"])
            runtime = self.runtimes.get(job_id)
            if runtime is None:
                say = self._say
                runtime = self.runtimes[job_id] = LocalRuntime(
                    job_id, self._sink, self.node, line_sink=self._line_sink, run_as=self.run_as,
                    say=(lambda text: say(job_id, text)) if say else None, mark=item.mark,
                    linger_s=self.line_linger_s)
            runtime.readopt(item)
            key = (job_id, name)
            self._newest[key] = max(self._newest.get(key, incarnation), incarnation)
            token = item.keep["token"]
            self.running[key] = Running(job_id, name, *incarnation, pid=item.pid, token=token,
                                        last_output=self.clock())
            self.control.accept_token(token, Incarnation(job_id, name, *incarnation), item.pid)
            taken += 1
        return taken

    # ------------------------------------------------------------ stopping

    def stop(self, order: StopOrder, background: bool = True) -> Optional[threading.Thread]:
        """Stop the incarnations: marked stopping at once, then (in a thread
        with ``background``, which the caller need not wait for) the stack
        dump and the signals. None when nothing of them is here to stop."""
        job_id = order.job_id
        if order.job_ended:
            self._ended.add(job_id)
        runtime = self.runtimes.get(job_id)
        adopted = [name for (job, name), r in self.running.items() if job == job_id and r.adopter is not None]
        if runtime is None and not adopted:
            return None
        names = list(order.names) or [*(runtime.running() if runtime else ()),
                                      *(name for job, name in self.running if job == job_id),
                                      *(name for job, name in self._held if job == job_id)]
        if order.incarnations:
            targets = dict(order.incarnations)
        else:
            # Resolved now, not in the background: by then a new incarnation may have taken the name.
            targets = {name: r.incarnation for name in dict.fromkeys(names)
                       if (r := self.running.get((job_id, name))) is not None}
        for name, incarnation in list(targets.items()):
            key = (job_id, name)
            # The stopped incarnation, or an older one, never starts here afterwards.
            self._newest[key] = max(self._newest.get(key, incarnation), incarnation)
            held = self._held.get(key)
            if held is not None and held.incarnation <= incarnation:
                self._cancel_held(key)
                if held.incarnation == incarnation:
                    del targets[name]  # it never ran: nothing of it to stop
        if order.job_ended:
            for key in [k for k in self._newest if k[0] == job_id]:
                del self._newest[key]
        # A stop already under way for the same incarnation (a hang's stack
        # dump, then the grace period) finishes it; a second one in parallel
        # would kill the processes while they are being dumped.
        for name, incarnation in list(targets.items()):
            under_way = self._stopping.get((job_id, name))
            if under_way is not None and under_way[0] == incarnation and under_way[1].is_alive():
                del targets[name]
        if not targets:
            self.counters.ignored_commands += 1
            return None
        self.counters.stops += 1
        # Only the targeted incarnations: a stop of an old one must not touch
        # the SDK calls, or dump the stacks, of the one that replaced it.
        found = {name: r for name, incarnation in targets.items()
                 if (r := self.incarnation(job_id, name, incarnation)) is not None}
        for running in found.values():
            self.control.mark_stopping(running.token)
        if not background:
            self._dump_then_stop(runtime, order, targets, found)
            return None
        thread = threading.Thread(target=self._dump_then_stop, args=(runtime, order, targets, found), daemon=True)
        thread.start()
        self._stoppers = [t for t in self._stoppers if t.is_alive()] + [thread]
        for name, incarnation in targets.items():
            self._stopping[(job_id, name)] = (incarnation, thread)
        return thread

    def _dump_then_stop(self, runtime: Optional[LocalRuntime], order: StopOrder,
                        targets: dict[str, tuple[int, int]], found: dict[str, Running]) -> None:
        if order.report_id:
            # Each instance's own process: one a standby became carries no token in its environ.
            roots = {name: r.pid if r.adopter is not None else (runtime.pid(name) if runtime else None)
                     for name, r in found.items()}
            dumps, missing = dump_stacks({name: r.token for name, r in found.items()}, roots,
                                         self.stack_tools, self.stack_timeout_s, self.node)
            if self._dumps_to is not None:
                self._dumps_to(order.job_id, order.report_id, dumps, missing)
        # The targeted incarnation, even one a newer one of its instance
        # replaced meanwhile (a lone restart's step overlaps the old one's).
        by_adopter: dict[int, tuple[Adopter, list[Stopped]]] = {}
        for r in found.values():
            if r.adopter is not None:
                by_adopter.setdefault(id(r.adopter), (r.adopter, []))[1].append(
                    Stopped(Incarnation(r.job_id, r.instance, r.round, r.start), r.pid))
        for adopter, stopped in by_adopter.values():
            adopter.stop(stopped, order.grace_s)
        own = [name for name in targets if not (name in found and found[name].adopter is not None)]
        if own and runtime is not None:
            runtime.stop(own, order.grace_s, targets)

    def incarnation(self, job_id: str, name: str, incarnation: tuple[int, int]) -> Optional[Running]:
        """This very incarnation, running or being stopped while a newer one starts."""
        running = self.running.get((job_id, name))
        if running is not None and running.incarnation == incarnation:
            return running
        return self.retiring.get((job_id, name, *incarnation))

    def mark_stopping(self, job_id: str, names: Sequence[str]) -> None:
        """Their SDK calls from now on are of an incarnation being stopped."""
        for name in names:
            running = self.running.get((job_id, name))
            if running is not None:
                self.control.mark_stopping(running.token)

    # ------------------------------------------------------------ the main loop's turn

    def poll(self) -> None:
        """What the adopters found, held starts whose stops ended, jobs let go of."""
        for adopter in self.adopters:
            for item in adopter.poll():
                if isinstance(item, Adopted):
                    self.adopt(item, adopter)
                else:
                    self.take(item)
        for key, held in list(self._held.items()):
            if not any(thread.is_alive() for thread in held.waits_for):
                del self._held[key]
                held.launch()
        if self._ended:
            self._let_go()

    def _let_go(self) -> None:
        """Ended jobs with nothing left running here: their runtimes close
        (standbys, keeper) in the background, not to delay the caller."""
        for job_id in list(self._ended):
            runtime = self.runtimes.get(job_id)
            if any(key[0] == job_id for key in self.running) or (runtime is not None and runtime.running()):
                continue
            self._ended.discard(job_id)
            if runtime is not None:
                del self.runtimes[job_id]
                threading.Thread(target=runtime.close, args=(0,), name=f"close-{job_id}", daemon=True).start()

    # ------------------------------------------------------------ following the output

    def take(self, item: Event) -> None:
        """A start, line or exit of an incarnation here (from its runtime's
        threads through the caller's inbox, or from an adopter)."""
        running = self.running.get((item.job_id, item.instance))
        retiring = False
        if running is None or running.incarnation != (item.round, item.start):
            running = self.retiring.get((item.job_id, item.instance, item.round, item.start))
            retiring = True
            if running is None:
                return  # an incarnation this host no longer knows
        if isinstance(item, LogLine):
            self.counters.lines += 1
            running.last_output = item.time
            running.tail.append(item.text)
            running.batch.append(item)
            self._write_file(item)
            if len(running.batch) >= BATCH_LINES:
                self._ship(running)
        elif isinstance(item, InstanceStarted):
            running.pid = item.pid
            self.output.on_started(item)
        elif isinstance(item, InstanceExited):
            self._ship(running)
            if self.files is not None:
                self.files.close_incarnation(item.job_id, item.instance, item.round, item.start)
            if retiring:
                del self.retiring[(item.job_id, item.instance, item.round, item.start)]
            else:
                del self.running[(item.job_id, item.instance)]
            self.control.revoke(running.token)
            self.output.on_exited(InstanceExited(job_id=item.job_id, time=item.time, instance=item.instance,
                                              round=item.round, start=item.start, exit_code=item.exit_code,
                                              tail=tuple(running.tail)))

    def _write_file(self, line: LogLine) -> None:
        if self.files is None:
            return
        try:
            self.files.write(line)
        except OSError:
            # A full disk: the line is still handed out and tailed; the file is tried again with the next one.
            self.counters.log_write_errors += 1

    def _ship(self, running: Running) -> None:
        if running.batch:
            lines, running.batch = running.batch, []
            self.output.on_lines([(running, lines)])

    def ship(self) -> None:
        """Every incarnation's lines not yet handed out, in one hand-over; the files flushed."""
        batches = []
        for running in [*self.running.values(), *self.retiring.values()]:
            if running.batch:
                batches.append((running, running.batch))
                running.batch = []
        if batches:
            self.output.on_lines(batches)
        if self.files is not None:
            self.files.flush()

    def jobs_here(self) -> list[str]:
        return sorted({r.job_id for r in self.running.values()})

    # ------------------------------------------------------------ closing

    def stop_everything(self, grace_s: float) -> None:
        """Every job's instances at once (one grace period in all, not one
        per job); returns within the grace period and half a second, a stack
        dump under way not waited for (its instances are stopped anyway)."""
        deadline = time.monotonic() + grace_s + 0.5
        stops = [threading.Thread(target=runtime.stop_all, args=(grace_s,), daemon=True)
                 for runtime in self.runtimes.values()]
        for thread in stops:
            thread.start()
        for thread in [*stops, *self._stoppers]:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        for runtime in self.runtimes.values():
            runtime.close(0)
        if self.files is not None:
            self.files.close()
