"""``trainwarden agent``: one per node.

Executes start/stop commands addressed to its node, runs the instances as
local processes (the same runtime as ``trainwarden run``), and ships what they
do: output lines in batches to the logs topic (and to files for Vector),
starts, exits with their last lines, and SDK messages to the events topic,
plus a heartbeat and per-job activity every second.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from trainwarden.bus import COMMANDS, DEAD_LETTERS, EVENTS, LOGS, NODES, PREFIX, Bus, BusError, Message
from trainwarden.bus.messages import (
    DeadLetterMessage,
    ExpectTasks,
    Heartbeat,
    Line,
    LogBatch,
    RunningInstance,
    StackDumps,
    StartInstance,
    StopInstances,
)
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.clock import now as clock_now
from trainwarden.diagnose.c4d import C4DFormatError, parse_line
from trainwarden.diagnose.collect import configured, dump_instances
from trainwarden.diagnose.stacks import dumps_to_json
from trainwarden.events import Activity, Diagnosis, InstanceActivity, InstanceExited, InstanceStarted, LogLine
from trainwarden.runtime.c4d_source import C4DSocket, FileFollower
from trainwarden.runtime.control import ControlServer, Incarnation, PendingReply
from trainwarden.runtime.environment import instance_env, sdk_import_dir
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.launcher import log_file
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.run_as import RunAs, sdk_home, share_sdk_path
from trainwarden.runtime.logfiles import LogFileLimits, RotatingLogFile
from trainwarden.runtime.slurm.adopt import SlurmTasks

TAIL_LINES = 500
BATCH_S = 0.2
BATCH_LINES = 500
REPORT_S = 1.0
# SIGTERM to SIGKILL of the instances when the agent itself stops, whatever
# the job's stop_grace_s: the whole agent must be gone within 5 s of its own
# SIGTERM, closing its consumers and producer included.
STOP_GRACE_S = 2.0

_log = logging.getLogger("trainwarden.agent")


@dataclasses.dataclass
class _Running:
    job_id: str
    instance: str
    round: int
    start: int
    pid: int = 0
    token: str = ""
    last_output: float = 0.0
    tail: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    batch: list = dataclasses.field(default_factory=list)
    files: dict = dataclasses.field(default_factory=dict)
    adopted: bool = False  # a Slurm task this agent follows, not a process it started


@dataclasses.dataclass
class _Held:
    """A start waiting for stops of its instance to finish (a hang's stack
    dump must see the old incarnation alive)."""

    incarnation: tuple[int, int]
    token: str
    waits_for: list  # the stopper threads
    launch: Callable[[], None]


@dataclasses.dataclass
class AgentCounters:
    commands: int = 0
    starts: int = 0
    stops: int = 0
    ignored_commands: int = 0
    held_starts_cancelled: int = 0  # a newer start or a stop came first: the held one never ran
    lines: int = 0
    dead_letters: int = 0
    c4d_refused: int = 0  # connections to the C4D socket from a job's process (or over its limits)
    sdk_refused: int = 0  # SDK requests refused: over a connection limit, idle, malformed, of no incarnation
    log_rotations: int = 0  # instance output files rotated at --log-file-max-mb (runtime/logfiles.py)
    log_lines_unwritten: int = 0  # lines left out of a full output file (still shipped and tailed)
    log_write_errors: int = 0  # output file writes that failed (a full disk)


class Agent:
    def __init__(self, bus: Bus, node: str, slots: int, log_dir: Path, address: str = "",
                 clock: Callable[[], float] = clock_now, ship_logs: bool = True, c4d_log: Optional[Path] = None,
                 slurm_dir: Optional[Path] = None, c4d_socket: Optional[Path] = None,
                 run_as: Optional[RunAs] = None, log_limits: LogFileLimits = LogFileLimits()):
        self.node = node
        self.run_as = run_as  # the user its instances run as (runtime/run_as.py)
        # False when Vector ships the log files: every line would arrive twice.
        self.ship_logs = ship_logs
        self.slots = slots
        self.log_dir = Path(log_dir)
        self.log_limits = log_limits
        self.address = address or _own_address()
        self.clock = clock
        self.counters = AgentCounters()
        self.inbox = Inbox()
        self.control = ControlServer(deliver=self.inbox.put,
                                     on_refused=lambda reason, raw: self.inbox.put(("refused", reason, raw)),
                                     adopts=slurm_dir is not None)
        if run_as is None:
            self.sdk_path = sdk_import_dir(self.log_dir / ".sdk")
        else:
            run_as.share_socket(self.control.path)
            self.sdk_path = sdk_import_dir(sdk_home())
            share_sdk_path(self.sdk_path)
        self.runtimes: dict[str, LocalRuntime] = {}
        self.running: dict[tuple[str, str], _Running] = {}
        # Incarnations being stopped while a newer one of the same instance
        # starts: what they print until they exit still ships (--follow, the
        # files, the exit's tail). Keyed by (job, instance, round, start).
        self.retiring: dict[tuple[str, str, int, int], _Running] = {}
        self.producer = bus.producer()
        self.consumer = bus.consumer([COMMANDS], f"{PREFIX}-agent-{node}", from_beginning=False)
        self._next_batch = self._next_report = 0.0
        self._ready = False
        self._joined: Optional[dict[tuple[str, int], int]] = None  # commands partition -> end offset when ready
        # The trusted diagnostic channel: the socket C4D's collector writes to
        # (the instances' processes refused), or C4D's log file.
        if c4d_socket:
            self.c4d = C4DSocket(c4d_socket, self._c4d_line, self._c4d_refused, self.control)
        else:
            self.c4d = FileFollower(c4d_log, self._c4d_line) if c4d_log else None
        self._stoppers: list[threading.Thread] = []
        # At most one held start per (job, instance): the newest one asked for.
        self._deferred: dict[tuple[str, str], _Held] = {}
        self._stopping: dict[tuple[str, str], tuple[tuple[int, int], threading.Thread]] = {}
        # The newest incarnation of each (job, instance) started or stopped
        # here: a start of that one again, or of an older one, is ignored.
        self._newest: dict[tuple[str, str], tuple[int, int]] = {}
        self._ended: set[str] = set()  # jobs that are over: let go of once nothing of them runs here
        # On a Slurm node: the tasks Slurm starts here, followed like our own instances.
        self.slurm = SlurmTasks(slurm_dir, node, clock, self.control.address) if slurm_dir else None

    # ------------------------------------------------------------ the loop

    def run_once(self, timeout_s: float = 0.05) -> None:
        commands = self.consumer.poll(timeout_s, max_records=100)
        for record in commands:
            self._command(record)
        if self.slurm is not None:
            for item in self.slurm.poll():
                if isinstance(item, tuple):
                    self._adopt(item[1])
                else:
                    self._local(item)
        if self._ended:
            self._let_go()
        for key, held in list(self._deferred.items()):
            if not any(thread.is_alive() for thread in held.waits_for):
                del self._deferred[key]
                held.launch()
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            item = self.inbox.get(0.0)
            if item is None:
                break
            self._local(item)
        now = self.clock()
        if now >= self._next_batch:
            self._ship_batches()
            self._next_batch = now + BATCH_S
        if now >= self._next_report and self.ready():
            # Only a node that will see its commands may be offered work.
            self._report(now)
            self._next_report = now + REPORT_S
        self.producer.flush()
        if commands:
            self.consumer.commit()

    def ready(self) -> bool:
        """Commands sent from now on reach this agent."""
        if not self._ready and self.consumer.ready():
            # Where the commands topic ended when this run of the agent could
            # first be heard of (its first heartbeat follows): see _command.
            self._joined = {tp: self.consumer.end_offset(*tp) for tp in self.consumer.assignment()}
            self._ready = True
        return self._ready

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.c4d is not None:
            self.c4d.close()
        deadline = time.monotonic() + grace_s + 0.5
        # Every job's instances at once: one grace period in all, not one per job.
        stops = [threading.Thread(target=runtime.stop_all, args=(grace_s,), daemon=True)
                 for runtime in self.runtimes.values()]
        for thread in stops:
            thread.start()
        for thread in [*stops, *self._stoppers]:
            # A stack dump under way is not waited for: its instances are being stopped anyway.
            thread.join(max(0.0, deadline - time.monotonic()))
        while (item := self.inbox.get(0.0)) is not None:
            self._local(item)
        self._ship_batches()
        try:
            self.producer.send(NODES, self.node, encode(Heartbeat(
                node=self.node, time=self.clock(), slots=self.slots, address=self.address, leaving=True)))
            self.producer.flush(5)
        except BusError:
            pass
        for runtime in self.runtimes.values():
            runtime.close(0)
        self.control.close()
        if self.run_as is not None:
            shutil.rmtree(Path(self.sdk_path).parent, ignore_errors=True)  # sdk_home()'s
        self.consumer.close()
        self.producer.close()

    # ------------------------------------------------------------ commands

    def _command(self, record: Message) -> None:
        try:
            command = decode(COMMANDS, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if command.node != self.node and not (command.node == "*" and isinstance(command, ExpectTasks)):
            return
        self.counters.commands += 1
        if isinstance(command, ExpectTasks):
            if self.slurm is not None:
                self.slurm.expect(command.job_id, command.incarnations)
            return
        if isinstance(command, StartInstance):
            # A start already in the topic before this run of the agent joined
            # was meant for its previous run, placed on heartbeats of that run:
            # by now the actuator may have placed the incarnation elsewhere.
            # Judged by offsets, not by comparing the actuator's clock with ours.
            joined = self._joined
            if joined is None or record.offset < joined.get((record.topic, record.partition), 0):
                self.counters.ignored_commands += 1
                return
            self._start(command)
        elif isinstance(command, StopInstances):
            self._stop(command)

    def _start(self, command: StartInstance) -> None:
        self._ended.discard(command.job_id)  # the same id again: a new job
        key = (command.job_id, command.instance.name)
        incarnation = (command.round, command.start)
        newest = self._newest.get(key)
        if newest is not None and incarnation <= newest:
            # The same incarnation again (a new actuator finishing its
            # predecessor's restart) or an older one arriving after a newer
            # start or stop: an incarnation runs once, never after a newer one.
            self.counters.ignored_commands += 1
            return
        self._newest[key] = incarnation
        # A held older start never runs; this one waits for what it waited for.
        waits_for = self._cancel_held(key)
        runtime = self.runtimes.get(command.job_id)
        if runtime is None:
            runtime = self.runtimes[command.job_id] = LocalRuntime(
                command.job_id, self.inbox.put, self.node, line_sink=self.inbox.offer_line,
                preload=command.preload, run_as=self.run_as,
                say=lambda text, job=command.job_id: _log.info("job %s: %s", job, text))
        current = self.running.get(key)
        if current is not None:
            self.retiring[(current.job_id, current.instance, current.round, current.start)] = current
        token = self.control.issue_token(Incarnation(command.job_id, command.instance.name, command.round,
                                                     command.start))
        env = instance_env(
            base=os.environ, job_id=command.job_id, spec=command.instance, world_size=command.world_size,
            round_=command.round, start=command.start, max_restarts=command.max_restarts,
            master_addr=command.master_addr, master_port=command.master_port,
            control_address=self.control.address, token=token, sdk_path=self.sdk_path, extra=dict(command.env),
            node=self.node,
        )
        self.running[key] = _Running(command.job_id, command.instance.name, command.round, command.start,
                                     token=token, last_output=self.clock())
        self.counters.starts += 1
        name = command.instance.name
        under_way = self._stopping.get(key)
        if under_way is not None and under_way[1] not in waits_for:
            waits_for.append(under_way[1])
        waits_for = [thread for thread in waits_for if thread.is_alive()]

        def launch() -> None:
            # Whatever incarnation of the instance still runs here is older:
            # stopped first (the runtime keeps one process per instance, and
            # one it lost track of would outlive every stop).
            runtime.stop([name], 5.0)
            pid = runtime.start(name, command.command, env, command.workdir or None, command.round, command.start)
            self.control.bind(token, pid)

        if waits_for:
            # Its stack dump must see the old incarnation alive. The start
            # waits, on this (main) thread: an instance gets SIGKILL when the
            # thread that started it ends (parent-death signal).
            self._deferred[key] = _Held(incarnation, token, waits_for, launch)
        else:
            launch()

    def _cancel_held(self, key: tuple[str, str]) -> list:
        """Drop the held start of this instance (it never ran); returns the
        stops it was waiting for."""
        held = self._deferred.pop(key, None)
        if held is None:
            return []
        entry = self.running.get(key)
        if entry is not None and (entry.round, entry.start) == held.incarnation:
            del self.running[key]
        self.control.revoke(held.token)
        self.counters.held_starts_cancelled += 1
        return list(held.waits_for)

    def _incarnation(self, job_id: str, name: str, incarnation: tuple[int, int]) -> Optional[_Running]:
        """This very incarnation, running or being stopped while a newer one starts."""
        running = self.running.get((job_id, name))
        if running is not None and (running.round, running.start) == incarnation:
            return running
        return self.retiring.get((job_id, name, *incarnation))

    def _stop(self, command: StopInstances) -> None:
        if command.job_ended:
            self._ended.add(command.job_id)
        runtime = self.runtimes.get(command.job_id)
        adopted = [name for (job_id, name), r in self.running.items() if job_id == command.job_id and r.adopted]
        if runtime is None and not adopted:
            return
        names = list(command.instances) or [*(runtime.running() if runtime else ()), *adopted,
                                            *(name for job_id, name in self._deferred if job_id == command.job_id)]
        if command.incarnations:
            targets = {name: (round_, start) for name, round_, start in command.incarnations}
        else:
            # Resolved now, not in the background thread: by then a new
            # incarnation may have taken the name.
            targets = {name: (r.round, r.start) for name in names
                       if (r := self.running.get((command.job_id, name))) is not None}
        for name, incarnation in list(targets.items()):
            key = (command.job_id, name)
            # The stopped incarnation, or an older one, never starts here afterwards.
            self._newest[key] = max(self._newest.get(key, incarnation), incarnation)
            held = self._deferred.get(key)
            if held is not None and held.incarnation <= incarnation:
                self._cancel_held(key)
                if held.incarnation == incarnation:
                    del targets[name]  # it never ran: nothing of it to stop
        if command.job_ended:
            # The job is over here: its id may come again, as a new job.
            for key in [k for k in self._newest if k[0] == command.job_id]:
                del self._newest[key]
        # A stop already under way for the same incarnation (a hang's stack
        # dump, then the grace period) finishes it; a second stop in parallel
        # (the actuator reconciling a heartbeat sent meanwhile) would kill
        # the processes while they are being dumped.
        for name, incarnation in list(targets.items()):
            under_way = self._stopping.get((command.job_id, name))
            if under_way is not None and under_way[0] == incarnation and under_way[1].is_alive():
                del targets[name]
        if not targets:
            self.counters.ignored_commands += 1
            return
        self.counters.stops += 1
        # Only the targeted incarnations: a stop of an old one must not touch
        # the SDK calls, or dump the stacks, of the one that replaced it.
        found = {name: r for name, incarnation in targets.items()
                 if (r := self._incarnation(command.job_id, name, incarnation)) is not None}
        tokens = {name: r.token for name, r in found.items()} if command.snapshot_report else {}
        for r in found.values():
            self.control.mark_stopping(r.token)
        # In the background: a grace period (or a stack dump) must not delay heartbeats.
        thread = threading.Thread(target=self._dump_then_stop, daemon=True,
                                  args=(runtime, command, list(targets), targets, tokens))
        thread.start()
        self._stoppers = [t for t in self._stoppers if t.is_alive()] + [thread]
        for name, incarnation in targets.items():
            self._stopping[(command.job_id, name)] = (incarnation, thread)

    def _dump_then_stop(self, runtime: Optional[LocalRuntime], command: StopInstances, names: list,
                        targets: dict, tokens: dict) -> None:
        if command.snapshot_report:
            tools, timeout = configured()
            try:
                # Each instance's own process: one a standby became carries no token in its environ.
                roots = {name: r.pid if r.adopted else (runtime.pid(name) if runtime is not None else None)
                         for name in tokens
                         if (r := self._incarnation(command.job_id, name, targets[name])) is not None}
                dumps, missing = dump_instances(tokens, tools, timeout, roots=roots)
            except Exception as exc:  # noqa: BLE001 - a failed dump must not keep the instances alive
                dumps, missing = [], [f"{self.node}: stack dump failed: {exc!r}"]
            try:
                self.producer.send(NODES, self.node, encode(StackDumps(
                    node=self.node, job_id=command.job_id, report_id=command.snapshot_report, time=self.clock(),
                    dumps_json=dumps_to_json(dumps), missing=tuple(missing))))
            except BusError:
                pass  # the report will say this node's dumps are missing
        # The targeted incarnation, even one a newer task of its instance
        # replaced meanwhile (a lone restart's step overlaps the old one's).
        tasks = {name: r.pid for name in names if name in targets
                 and (r := self._incarnation(command.job_id, name, targets[name])) is not None and r.adopted}
        if tasks and self.slurm is not None:
            self.slurm.stop(list(tasks.values()), command.grace_s)
        own = [name for name in names if name not in tasks]
        if own and runtime is not None:
            runtime.stop(own, command.grace_s, targets)

    def _let_go(self) -> None:
        """Ended jobs with nothing left running here: their runtimes close
        (standbys, keeper) in the background, not to delay heartbeats."""
        for job_id in list(self._ended):
            runtime = self.runtimes.get(job_id)
            if any(key[0] == job_id for key in self.running) or (runtime is not None and runtime.running()):
                continue
            self._ended.discard(job_id)
            if runtime is not None:
                del self.runtimes[job_id]
                threading.Thread(target=runtime.close, args=(0,), name=f"close-{job_id}", daemon=True).start()

    def _adopt(self, adopted) -> None:
        """A Slurm task announced by the actuator started here: one of our instances from now on."""
        inc = adopted.incarnation
        key = (inc.job_id, inc.instance)
        current = self.running.get(key)
        if current is not None:
            self.retiring[(current.job_id, current.instance, current.round, current.start)] = current
        self.control.accept_token(adopted.token, inc, adopted.pid)
        self.running[key] = _Running(inc.job_id, inc.instance, inc.round, inc.start, pid=adopted.pid,
                                     token=adopted.token, last_output=self.clock(), adopted=True)
        self.counters.starts += 1

    # ------------------------------------------------------ local events

    def _local(self, item) -> None:
        if isinstance(item, PendingReply):
            self._sdk(item)
            return
        if isinstance(item, tuple) and item[0] == "c4d":
            self._diagnosis(item[1])
            return
        if isinstance(item, tuple) and item[0] == "refused":
            self._refused(item[1], item[2])
            return
        if isinstance(item, tuple) and item[0] == "c4d-refused":
            self._refused(item[1], item[2].encode(), topic="c4d")
            return
        running = self.running.get((item.job_id, item.instance))
        retiring = False
        if running is None or (running.round, running.start) != (item.round, item.start):
            running = self.retiring.get((item.job_id, item.instance, item.round, item.start))
            retiring = True
            if running is None:
                return  # an incarnation this agent no longer knows
        if isinstance(item, LogLine):
            self.counters.lines += 1
            running.last_output = item.time
            running.tail.append(item.text)
            running.batch.append(Line(item.time, item.stream, item.text))
            self._write_file(running, item)
            if len(running.batch) >= BATCH_LINES:
                self._ship(running)
        elif isinstance(item, InstanceStarted):
            running.pid = item.pid
            self.producer.send(EVENTS, item.job_id, encode(item))
        elif isinstance(item, InstanceExited):
            self._ship(running)
            for handle in running.files.values():
                handle.close()
            if retiring:
                del self.retiring[(item.job_id, item.instance, item.round, item.start)]
            else:
                del self.running[(item.job_id, item.instance)]
            self.control.revoke(running.token)
            exited = InstanceExited(job_id=item.job_id, time=item.time, instance=item.instance, round=item.round,
                                    start=item.start, exit_code=item.exit_code, tail=tuple(running.tail))
            self.producer.send(EVENTS, item.job_id, encode(exited))

    def _refused(self, reason: str, raw: bytes, topic: str = "sdk") -> None:
        """An SDK request (or a C4D line) the endpoint refused: a dead letter, for the history."""
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, f"agent-{self.node}", encode(DeadLetterMessage(
            time=self.clock(), service=f"agent-{self.node}", topic=topic, partition=-1, offset=-1,
            key=self.node, error=reason[:2000], value=raw[:16384].decode("utf-8", errors="replace"))))

    def _c4d_line(self, line: str) -> None:
        """From the follower's thread: hand the finding to the main loop."""
        self.inbox.put(("c4d", line))

    def _c4d_refused(self, reason: str, attempt: str) -> None:
        """From the socket's thread: a job's process wrote to the C4D socket."""
        self.inbox.put(("c4d-refused", reason, attempt))

    def _diagnosis(self, line: str) -> None:
        try:
            finding = parse_line(line)
        except C4DFormatError as exc:
            self.counters.dead_letters += 1
            self.producer.send(DEAD_LETTERS, f"agent-{self.node}", encode(DeadLetterMessage(
                time=self.clock(), service=f"agent-{self.node}", topic="c4d", partition=-1, offset=-1,
                key=self.node, error=str(exc), value=line[:16384])))
            return
        if finding is None:
            return
        # A finding names a job, or concerns every job with instances on this node.
        jobs = [finding.job] if finding.job else sorted({r.job_id for r in self.running.values()})
        for job_id in jobs:
            self.producer.send(EVENTS, job_id, encode(Diagnosis(
                job_id=job_id, time=self.clock(), node=finding.node or self.node, source="c4d", kind=finding.kind,
                level=finding.level, rank=finding.rank, detail=finding.detail)))

    def _sdk(self, pending: PendingReply) -> None:
        if not pending.take():
            return
        message = pending.message
        try:
            self.producer.send(EVENTS, message.job_id, encode(message))
            # Durable in the job's ordered partition before the call returns:
            # an exit reported later is judged with this message already known.
            self.producer.flush(10)
        except BusError as exc:
            pending.resolve(False, f"the event bus did not take the message: {exc}")
            return
        pending.resolve(True, "taken")

    def _write_file(self, running: _Running, line: LogLine) -> None:
        try:
            handle = running.files.get(line.stream)
            if handle is None:
                path = log_file(self.log_dir, running.job_id, running.instance, running.round, running.start,
                                line.stream.value)
                handle = running.files[line.stream] = RotatingLogFile(path, self.log_limits, self.counters)
            handle.write_line(line.text)
        except OSError:
            # A full disk: the line is still shipped and tailed; the file is tried again with the next one.
            self.counters.log_write_errors += 1

    # ------------------------------------------------------------ shipping

    def _ship(self, running: _Running) -> None:
        if not running.batch:
            return
        if not self.ship_logs:
            running.batch = []
            for handle in running.files.values():
                handle.flush()
            return
        batch = LogBatch(job_id=running.job_id, node=self.node, instance=running.instance, round=running.round,
                         start=running.start, lines=tuple(running.batch))
        running.batch = []
        self.producer.send(LOGS, running.job_id, encode(batch))
        for handle in running.files.values():
            handle.flush()

    def _ship_batches(self) -> None:
        for running in [*self.running.values(), *self.retiring.values()]:
            self._ship(running)

    def _report(self, now: float) -> None:
        # Counted by the sockets' threads, every one (only a few per origin are dead-lettered).
        self.counters.sdk_refused = self.control.refusals.total
        if isinstance(self.c4d, C4DSocket):
            self.counters.c4d_refused = self.c4d.refused
        by_job: dict[str, list[_Running]] = collections.defaultdict(list)
        for running in self.running.values():
            by_job[running.job_id].append(running)
        for job_id, items in by_job.items():
            self.producer.send(EVENTS, job_id, encode(InstanceActivity(
                job_id=job_id, time=now, node=self.node,
                # Silence as a duration of this clock: the processor dates it by its own.
                instances=tuple(Activity(r.instance, r.round, r.start, r.last_output,
                                         silent_s=round(max(0.0, now - r.last_output), 3), spoke=bool(r.tail))
                                for r in items))))
        self.producer.send(NODES, self.node, encode(Heartbeat(
            node=self.node, time=now, slots=self.slots, address=self.address,
            running=tuple(RunningInstance(r.job_id, r.instance, r.round, r.start, r.pid)
                          for r in self.running.values()))))

    def _dead_letter(self, record: Message, error: str) -> None:
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, f"agent-{self.node}", dead_letter(record, f"agent-{self.node}", error, self.clock()))


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
