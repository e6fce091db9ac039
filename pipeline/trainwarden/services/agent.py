"""``trainwarden agent``: one per node, a bus adapter over the node host.

Executes start/stop commands addressed to its node through its node host
(runtime/nodehost.py: the same starts, stops and stack dumps as ``trainwarden
run``), and ships what the host hands out: output lines in batches to the
logs topic, one message per job and turn (the host writes the files Vector ships), starts, exits with their
last lines, stack dumps, and SDK messages to the events topic, plus a
heartbeat and per-job activity every second. Processes another engine
started on this node come in through the adopters it is given
(runtime/adoption.py), announced by ``ExpectTasks``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Callable, Optional, Sequence

from trainwarden.bus import COMMANDS, DEAD_LETTERS, EVENTS, LOGS, NODES, PREFIX, Bus, BusError, Message
from trainwarden.bus.messages import (
    DeadLetterMessage,
    ExpectTasks,
    Heartbeat,
    Line,
    LogPart,
    NodeLogBatch,
    RunningInstance,
    StackDumps,
    StartInstance,
    StartInstances,
    StopInstances,
)
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.clock import now as clock_now
from trainwarden.diagnose.collect import configured
from trainwarden.diagnose.stacks import dumps_to_json
from trainwarden.events import Activity, InstanceActivity, InstanceExited, InstanceStarted, LogLine
from trainwarden.runtime.adoption import AdopterFactory
from trainwarden.runtime.c4d_source import C4DSocket, open_channel
from trainwarden.runtime.control import ControlServer, PendingReply
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.keeper_lease import KeeperLease, KeptInstance, enable_kept_instances, listen_at, reclaim
from trainwarden.runtime.keeper_lease import socket_path_for
from trainwarden.runtime.logfiles import LogFileLimits
from trainwarden.runtime.nodehost import HostCounters, NodeHost, Running, StartOrder, StopOrder
from trainwarden.runtime.run_as import RunAs, sdk_home
from trainwarden.services.command_feed import CommandBatch, CommandFeed
from trainwarden.store.records import DeadLetter
from trainwarden.supervision.intake import dead_letter as dead_letter_record
from trainwarden.supervision.intake import diagnosis, read_channel_line, refused_request

BATCH_S = 0.2
REPORT_S = 1.0
# A run that took its predecessor's instances back reports in once the
# commands read before it joined are carried out, or after this long.
CATCH_UP_LIMIT_S = 2.0
# Output is read in turns at most this far apart while it flows: a line
# waits at most this long more, and is shipped every BATCH_S anyway.
LINE_LINGER_S = 0.05
# SIGTERM to SIGKILL of the instances when the agent itself stops, whatever
# the job's stop_grace_s: the whole agent must be gone within 5 s of its own
# SIGTERM, closing its consumers and producer included.
STOP_GRACE_S = 2.0
COMMAND_FETCH_WAIT_S = 0.5
# A job's lines of one turn go in one message up to about this much text
# (then more messages, in order): far under the bus's request and decoding
# bounds (bus/kafka.py, bus/serde.py), a part of one incarnation never split.
SHIP_CHARS = 512 * 1024

_log = logging.getLogger("trainwarden.agent")


@dataclasses.dataclass
class AgentCounters(HostCounters):
    commands: int = 0
    dead_letters: int = 0
    c4d_refused: int = 0  # connections to the C4D socket from a job's process (or over its limits)
    sdk_refused: int = 0  # SDK requests refused: over a connection limit, idle, malformed, of no incarnation


class Agent:
    def __init__(self, bus: Bus, node: str, slots: int, log_dir: Path, address: str = "",
                 clock: Callable[[], float] = clock_now, ship_logs: bool = True, c4d_log: Optional[Path] = None,
                 adopters: Sequence[AdopterFactory] = (), c4d_socket: Optional[Path] = None,
                 run_as: Optional[RunAs] = None, log_limits: LogFileLimits = LogFileLimits(),
                 control_path: Optional[Path] = None, readopt_grace_s: float = 0.0):
        """``adopters``: the engines whose processes on this node the agent
        follows once proven (``runtime/adoption.py``); ``control_path``: where
        its SDK endpoint listens, when the instances must find it at a known
        path (a pod mounts its directory); else a private directory;
        ``readopt_grace_s``: how long its instances outlive it (killed,
        crashed) waiting for its next run, which takes them back
        (runtime/keeper_lease.py); 0: they end with it."""
        self.node = node
        self.run = uuid.uuid4().hex[:12]  # this run of the agent, in its heartbeats
        self.run_as = run_as  # the user its instances run as (runtime/run_as.py)
        # False when Vector ships the log files: every line would arrive twice.
        self.ship_logs = ship_logs
        self.slots = slots
        self.log_dir = Path(log_dir)
        self.address = address or _own_address()
        self.clock = clock
        self.counters = AgentCounters()
        # Lines are shipped every BATCH_S: they need not wake the loop (128 a second per agent in bench/scale.py).
        self.inbox = Inbox(wake_on_lines=False)
        kept = self._reclaim(readopt_grace_s)
        owns_directory = None
        if kept and control_path is None and kept[0].keep.get("control"):
            # The instances taken back call the SDK endpoint of the previous run: here again.
            control_path, owns_directory = Path(kept[0].keep["control"]), True
        self.control = ControlServer(deliver=self.inbox.put,
                                     on_refused=lambda reason, raw: self.inbox.put(("refused", reason, raw)),
                                     path=_endpoint(control_path), adopts=bool(adopters), owns_directory=owns_directory)
        if run_as is not None:
            run_as.share_socket(self.control.path)
        tools, timeout = configured()
        sdk_dir = sdk_home() if run_as is not None else self.log_dir / ".sdk"
        if control_path is not None:
            sdk_dir = control_path.parent  # the SDK's copy beside the endpoint: the pods mount both
        self.host = NodeHost(
            node, self.control, self.inbox.put, sdk_dir,
            output=self, line_sink=self.inbox.offer_line, run_as=run_as,
            say=lambda job, text: _log.info("job %s: %s", job, text), adopters=adopters, stack_tools=tools,
            stack_timeout_s=timeout, log_dir=self.log_dir, log_limits=log_limits, counters=self.counters,
            dumps_to=self._dumps, clock=clock, line_linger_s=LINE_LINGER_S)
        self.readopted = self.host.readopt(kept)
        self._ready_since = 0.0
        self._reported_in = False
        # Exits of instances taken back, held until this run has reported in
        # with them running: the actuator takes one placed here that the new
        # run's first heartbeat does not list for lost with the old run.
        self._held_exits: Optional[list] = [] if self.readopted else None
        if self.readopted:
            _log.info("took back %d instances its previous run left running", self.readopted)
        self._lease: Optional[KeeperLease] = None
        if readopt_grace_s > 0:
            # Held for the agent's life: the keeper waits for its next run even with no job here yet.
            self._lease = KeeperLease(f"agent-{self.run}")
            listener = listen_at(self._keeper_path)
            try:
                enable_kept_instances(listener, readopt_grace_s)
            finally:
                listener.close()  # the keeper holds it
        self.producer = bus.producer()
        # Idle most of the time, and one per node: each fetch waiting half a
        # second asks the broker 2 times a second, not 10 (a command ends the
        # wait at once), which was most of an idle agent's CPU (docs/PERFORMANCE.md).
        self.consumer = bus.consumer([COMMANDS], f"{PREFIX}-agent-{node}", from_beginning=False,
                                     fetch_wait_s=COMMAND_FETCH_WAIT_S)
        self._next_batch = self._next_report = 0.0
        self.c4d = open_channel(c4d_socket, c4d_log, self._c4d_line, self._c4d_refused, self.control)
        # Where the commands topic ended when this run of the agent could
        # first be heard of (its first heartbeat follows readiness): see _command.
        self.feed = CommandFeed(self.consumer, self.inbox.put,
                                on_ready=lambda: {tp: self.consumer.end_offset(*tp) for tp in self.consumer.assignment()})

    @property
    def running(self) -> dict[tuple[str, str], Running]:
        """(job, instance) -> the incarnation of it running here."""
        return self.host.running

    def _reclaim(self, grace_s: float) -> list[KeptInstance]:
        """What the keeper of this node's previous agent run kept, if it waits."""
        self._keeper_path = socket_path_for(self.log_dir)
        if grace_s <= 0:
            return []
        try:
            return reclaim(self._keeper_path)
        except (OSError, ValueError, KeyError) as exc:
            _log.warning("could not take back what this node's previous agent run left (%s); "
                         "its keeper ends it after its grace period", exc)
            return []

    # ------------------------------------------------------------ the loop

    def run_once(self, timeout_s: float = 0.05) -> None:
        if self.feed.error is not None:
            raise self.feed.error
        self.host.poll()
        item = self.inbox.get(timeout_s)
        deadline = time.monotonic() + 0.2
        while item is not None:
            self._local(item)
            if time.monotonic() >= deadline:
                break
            item = self.inbox.get(0.0)
        now = self.clock()
        if now >= self._next_batch:
            self.host.ship()
            self._next_batch = now + BATCH_S
        if now >= self._next_report and self.ready():
            # Only a node that will see its commands may be offered work.
            self._report(now)
            self._next_report = now + REPORT_S
            self._release_exits()
        self.producer.flush()

    def ready(self) -> bool:
        """Commands sent from now on reach this agent (and, for a run that
        took its predecessor's instances back, those sent before are carried
        out: its first heartbeat must report the starts they asked for)."""
        if not self.feed.is_ready:
            return False
        if self._reported_in:
            return True
        how = "its commands are read from here on"
        if self.readopted:
            now = time.monotonic()
            self._ready_since = self._ready_since or now
            # Bounded: a heartbeat must come well within the node timeout, caught up or not.
            if not (self.feed.caught_up or now - self._ready_since > CATCH_UP_LIMIT_S):
                return False
            how = (f"{now - self._ready_since:.2f} s after joining, "
                   + ("its predecessor's commands carried out" if self.feed.caught_up else "not caught up yet"))
        self._reported_in = True
        # Once per run: an operator (and the cluster tests) can tell when the node may be offered work.
        _log.info("reporting in (%s)", how)
        return True

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        self.feed.close()  # no command is carried out from now on
        if self.c4d is not None:
            self.c4d.close()
        self.host.stop_everything(grace_s)
        while (item := self.inbox.get(0.0)) is not None:
            if not isinstance(item, CommandBatch):  # read, not carried out: not committed either
                self._local(item)
        self._release_exits()
        self.host.ship()
        try:
            self.producer.send(NODES, self.node, encode(Heartbeat(
                node=self.node, time=self.clock(), slots=self.slots, address=self.address, leaving=True,
                run=self.run)))
            self.producer.flush(5)
        except BusError:
            pass
        self.host.close()
        if self._lease is not None:
            self._lease.close()
            # An orderly end leaves nothing for a next run to take.
            self._keeper_path.unlink(missing_ok=True)
            try:
                self._keeper_path.parent.rmdir()
            except OSError:
                pass
        self.control.close()
        if self.run_as is not None:
            shutil.rmtree(Path(self.host.sdk_path).parent, ignore_errors=True)  # sdk_home()'s
        self.consumer.close()
        self.producer.close()

    # ------------------------------------------------------------ commands

    def _command(self, record: Message) -> None:
        # Every agent reads every node's commands, keyed by node (which a
        # signed message binds): the others' are not even decoded, 15 in 16
        # of a 1,024-wide restart's on 16 agents (a node's starts of a round
        # come in one message: services/actuator_service.py).
        if record.key not in (self.node, "*"):
            return
        try:
            command = decode(COMMANDS, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if command.node != self.node and not (command.node == "*" and isinstance(command, ExpectTasks)):
            return
        self.counters.commands += 1
        if isinstance(command, ExpectTasks):
            self.host.expect(command.job_id, command.incarnations)
            return
        if isinstance(command, StartInstances):
            for start in command.starts:
                if start.node == self.node and start.job_id == command.job_id:  # as the signed envelope says
                    self._start(record, start)
        elif isinstance(command, StartInstance):
            self._start(record, command)
        elif isinstance(command, StopInstances):
            self.host.stop(StopOrder(
                job_id=command.job_id, grace_s=command.grace_s, names=tuple(command.instances),
                incarnations={name: (round_, start) for name, round_, start in command.incarnations} or None,
                report_id=command.snapshot_report, job_ended=command.job_ended))

    def _start(self, record: Message, command: StartInstance) -> None:
        # A start already in the topic before this run of the agent joined
        # was meant for its previous run, placed on heartbeats of that run:
        # by now the actuator may have placed the incarnation elsewhere.
        # Judged by offsets, not by comparing the actuator's clock with ours.
        # A run that took its predecessor's instances back continues it
        # on the same node (never lost meanwhile: the keeper's grace is
        # under the node timeout), so those starts are still its own.
        joined = self.feed.joined
        if not self.readopted and (joined is None or record.offset < joined.get((record.topic, record.partition), 0)):
            self.counters.ignored_commands += 1
            return
        self.host.start(StartOrder(
            job_id=command.job_id, spec=command.instance, command=command.command, round=command.round,
            start=command.start, world_size=command.world_size, max_restarts=command.max_restarts,
            master_addr=command.master_addr, master_port=command.master_port, env=dict(command.env),
            workdir=command.workdir or None, preload=command.preload))

    # ------------------------------------------------------ what the node host hands out

    def on_started(self, event: InstanceStarted) -> None:
        self.producer.send(EVENTS, event.job_id, encode(event))

    def on_lines(self, batches: list[tuple[Running, list[LogLine]]]) -> None:
        if not self.ship_logs:
            return
        by_job: dict[str, list[tuple[LogPart, int]]] = collections.defaultdict(list)
        for running, lines in batches:
            part = LogPart(instance=running.instance, round=running.round, start=running.start,
                           lines=tuple(Line(line.time, line.stream, line.text) for line in lines))
            by_job[running.job_id].append((part, sum(len(line.text) for line in lines)))
        for job_id, parts in by_job.items():
            # Keyed by job as before: one partition, the job's lines in order.
            for chunk in _chunks(parts, SHIP_CHARS):
                self.producer.send(LOGS, job_id, encode(NodeLogBatch(job_id=job_id, node=self.node, parts=chunk)))

    def on_exited(self, event: InstanceExited) -> None:
        self.producer.send(EVENTS, event.job_id, encode(event))

    def _dumps(self, job_id: str, report_id: str, dumps: list, missing: list) -> None:
        """From a stopper thread: this node's part of a hung job's stack report."""
        try:
            self.producer.send(NODES, self.node, encode(StackDumps(
                node=self.node, job_id=job_id, report_id=report_id, time=self.clock(),
                dumps_json=dumps_to_json(dumps), missing=tuple(missing))))
        except BusError:
            pass  # the report will say this node's dumps are missing

    # ------------------------------------------------------ local events

    def _local(self, item) -> None:
        if isinstance(item, CommandBatch):
            try:
                for record in item.records:
                    self._command(record)
            finally:
                item.handled()
        elif isinstance(item, PendingReply):
            self._sdk(item)
        elif isinstance(item, tuple) and item[0] == "c4d":
            self._diagnosis(item[1])
        elif isinstance(item, tuple) and item[0] == "refused":
            self._refused(refused_request("", item[1], item[2], self.clock()))
        elif isinstance(item, tuple) and item[0] == "c4d-refused":
            self._refused(dead_letter_record("", "c4d", item[1], item[2], self.clock()))
        elif isinstance(item, InstanceExited) and self._held_exits is not None:
            self._held_exits.append(item)
        else:
            self.host.take(item)

    def _release_exits(self) -> None:
        held, self._held_exits = self._held_exits, None
        for item in held or ():
            self.host.take(item)

    def _refused(self, letter: DeadLetter) -> None:
        """An SDK request or a C4D line refused, as intake bounds it: a dead letter, for the history."""
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, f"agent-{self.node}", encode(DeadLetterMessage(
            time=letter.time, service=f"agent-{self.node}", topic=letter.source, partition=-1, offset=-1,
            key=self.node, error=letter.error, value=letter.payload)))

    def _c4d_line(self, line: str) -> None:
        """From the follower's thread: hand the finding to the main loop."""
        self.inbox.put(("c4d", line))

    def _c4d_refused(self, reason: str, attempt: str) -> None:
        """From the socket's thread: a job's process wrote to the C4D socket."""
        self.inbox.put(("c4d-refused", reason, attempt))

    def _diagnosis(self, line: str) -> None:
        now = self.clock()
        found = read_channel_line(line, now)
        if isinstance(found, DeadLetter):
            self._refused(found)
            return
        if found is None:
            return
        # A finding names a job, or concerns every job with instances on this node.
        for job_id in [found.job] if found.job else self.host.jobs_here():
            self.producer.send(EVENTS, job_id, encode(diagnosis(job_id, found, self.node, now)))

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

    # ------------------------------------------------------------ reporting

    def _report(self, now: float) -> None:
        # Counted by the sockets' threads, every one (only a few per origin are dead-lettered).
        self.counters.sdk_refused = self.control.refusals.total
        if isinstance(self.c4d, C4DSocket):
            self.counters.c4d_refused = self.c4d.refused
        by_job: dict[str, list[Running]] = collections.defaultdict(list)
        for running in self.host.running.values():
            by_job[running.job_id].append(running)
        for job_id, items in by_job.items():
            self.producer.send(EVENTS, job_id, encode(InstanceActivity(
                job_id=job_id, time=now, node=self.node,
                # Silence as a duration of this clock: the processor dates it by its own.
                instances=tuple(Activity(r.instance, r.round, r.start, r.last_output,
                                         silent_s=round(max(0.0, now - r.last_output), 3), spoke=bool(r.tail))
                                for r in items))))
        self.producer.send(NODES, self.node, encode(Heartbeat(
            node=self.node, time=now, slots=self.slots, address=self.address, run=self.run,
            running=tuple(RunningInstance(r.job_id, r.instance, r.round, r.start, r.pid)
                          for r in self.host.running.values()))))

    def _dead_letter(self, record: Message, error: str) -> None:
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, f"agent-{self.node}", dead_letter(record, f"agent-{self.node}", error, self.clock()))


def _chunks(parts: list[tuple[LogPart, int]], most_chars: int) -> list[tuple[LogPart, ...]]:
    """Parts (with their text's length) in order, grouped up to ``most_chars`` a group."""
    chunks: list[tuple[LogPart, ...]] = []
    chunk: list[LogPart] = []
    size = 0
    for part, chars in parts:
        if chunk and size + chars > most_chars:
            chunks.append(tuple(chunk))
            chunk, size = [], 0
        chunk.append(part)
        size += chars
    if chunk:
        chunks.append(tuple(chunk))
    return chunks


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _endpoint(path: Optional[Path]) -> Optional[Path]:
    if path is not None:
        # Entered by the jobs' processes to reach the socket (which grants nothing by itself: control.py).
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    return path
