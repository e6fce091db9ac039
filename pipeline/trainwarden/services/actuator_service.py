"""``trainwarden actuator``: executes decisions on the cluster.

Consumes decisions (a consumer group), heartbeats and its own state topic.
Each decision is executed through the same ``Actuator`` as in the embedded
run, whose runtime here places instances on ready nodes and sends start/stop
commands to their agents. On the compacted ``trainwarden.actuator`` topic, an
``action_intent`` is durable before a decision's first command and its
``action_done`` (with the incarnations it started) once every command is;
only then is the decision's offset committed. A restarted actuator reads them
back: it never acts twice, knows each instance's current incarnation from
its own records (never from heartbeats), and finishes an action its
predecessor left between the two records with the same incarnations, after
hearing every agent, so that a start goes where it may already run. Nodes
that stop sending heartbeats are lost, and every job with instances on them
gets a ``node_lost`` event, so the engine decides what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Mapping, Optional, Sequence

from trainwarden import failpoint
from trainwarden.actuator import started_incarnations
from trainwarden.bus import (
    ACTUATOR_STATE,
    COMMANDS,
    DEAD_LETTERS,
    DECISIONS,
    EVENTS,
    LOGS,
    NODES,
    PREFIX,
    Bus,
    BusError,
    Message,
)
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import (
    ActionDone,
    ActionIntent,
    DeadLetterMessage,
    Heartbeat,
    NodeState,
    Recorded,
    StackDumps,
    StackReportReady,
    StartInstance,
    StartInstances,
    StopInstances,
)
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.clock import now as clock_now
from trainwarden.engine import JobStatus
from trainwarden.events import Decision, DecisionKind, InstanceSpec, JobSpec, NodeLost, Preempted, Reason
from trainwarden.runtime import registry
from trainwarden.runtime.agents import UnplacedRuntime
from trainwarden.runtime.base import (AgentCommand, CapacityTaken, DumpsExpected, EngineError, JobEvent, JobToRun,
                                      NodeDown, NodeIsolated, RuntimeEvent, RuntimeSite, WaitingForCapacity)
from trainwarden.runtime.nodes import Cluster, NodeStatus
from trainwarden.settings import SettingsError, parse_args_string
from trainwarden.store.base import StoreError
from trainwarden.store.records import DeadLetter, NodeEventRecord
from trainwarden.limits import DEAD_LETTER_VALUE_CHARS
from trainwarden.supervision.acting import FINAL, JobFacts, Supervisor
from trainwarden.supervision.intake import dead_letter as dead_letter_row
from trainwarden.supervision.stack_reports import StackReports

GROUP = f"{PREFIX}-actuator"
NODE_TIMEOUT_S = 10.0
# A round's starts for one node go in messages of at most this many (about
# 2 KiB each: far under the bus's request bound).
STARTS_PER_MESSAGE = 128
# The actuator's own heartbeat through the bus: while it does not come back,
# missing heartbeats say nothing about the nodes.
PROBE_NODE = "__actuator_probe__"
PROBE_EVERY_S = 1.0
PROBE_LATE_S = 2.5
# An actuator that finds actions its predecessor left unfinished first hears
# every agent this long (their heartbeats come every second): a start it
# sends again goes to the node that already runs that incarnation, if any.
HEAR_BEFORE_FINISHING_S = 2.5
# A stray incarnation's stop is asked again after this long (its 5 s grace, and a heartbeat).
RECONCILE_AGAIN_S = 7.0
# Decisions whose action has side effects: an intent record before the first.
INTENDED = frozenset(DecisionKind) - {DecisionKind.NOTIFY, DecisionKind.QUEUE_JOB}


@dataclasses.dataclass
class ActuatorCounters:
    decisions: int = 0
    duplicates: int = 0
    commands: int = 0
    waiting_for_capacity: int = 0
    nodes_lost: int = 0
    agent_restarts: int = 0  # a node's agent reported in as a new run (its instances it did not keep: lost)
    preemptions: int = 0
    dead_letters: int = 0
    history_errors: int = 0
    runtime_errors: int = 0  # a runtime's engine failed a call (runtime/base.EngineError): tried again
    refused_starts: int = 0  # starts whose arguments string does not parse: failed as invalid_job, nothing run
    finished: int = 0  # actions a previous actuator (or a bus error) left between intent and done


class ActuatorService:
    def __init__(self, bus: Bus, history, node_timeout_s: float = NODE_TIMEOUT_S,
                 clock: Callable[[], float] = clock_now, group: str = GROUP,
                 sites: Optional[Mapping[str, RuntimeSite]] = None,
                 say: Callable[[str, str], None] = lambda text, job_id: None):
        """sites: the runtimes this actuator reaches besides the agents, by
        kind (runtime/registry.sites builds them from its options)."""
        self.history = history
        self.sites = {**registry.sites({}), **(sites or {})}
        self.say = say
        self.clock = clock
        self.counters = ActuatorCounters()
        self.cluster = Cluster(node_timeout_s)
        self._agent_runs: dict[str, str] = {}  # node -> the run of its agent last heard (Heartbeat.run)
        self.reports = StackReports(history, clock, announce=self._announce_report)
        self.executed: set[str] = set()
        self._reconciled: dict[tuple, float] = {}  # (node, job, instance, round, start) -> its stop last asked
        self.jobs: dict[str, Supervisor] = {}
        # From the state topic: actions with an intent and no done record yet
        # (finished before any new decision), each job's newest incarnations
        # and job restarts, and the hangs whose stack report is stored.
        self.unfinished: dict[str, Decision] = {}
        self.incarnations: dict[str, dict[str, tuple[int, int]]] = {}
        self.restart_ids: dict[str, set[str]] = {}
        self.reported: set[str] = set()
        self.producer = bus.producer()
        # A failpoint (a test hook) dies with what was sent before it on the bus.
        failpoint.settle_with(self.producer.flush)
        self.state_reader = bus.consumer([ACTUATOR_STATE], None, from_beginning=True)
        self._load_state()
        self.heartbeats = bus.consumer([NODES], None, from_beginning=False)
        self._hearing_since: Optional[float] = None
        self.assigned: list = []
        # Decisions polled and not yet carried out: a bus error leaves the
        # rest of a batch here, for the next turn, rather than skipping it.
        self._backlog: list[Message] = []
        self.decisions = bus.consumer([DECISIONS], group, from_beginning=True, on_assign=self._on_assign)
        # Every service's dead letters end in the history, which this service owns.
        self.letters = bus.consumer([DEAD_LETTERS], f"{group}-dead-letters", from_beginning=True)
        self.started_at = clock()
        self.probe_id = f"{id(self):x}-{clock()}"
        self._probe_sent = 0.0
        self._probe_seen = clock()
        self.bus_healthy = True

    def _on_assign(self, partitions) -> None:
        self.assigned = sorted(partitions)

    # -------------------------------------------------------------- state

    def _load_state(self) -> None:
        """Everything this actuator (or its predecessor) has done, to the end:
        an action missed here would be executed a second time."""
        for record in read_to_end(self.state_reader):
            self._state_record(record)

    def _state_record(self, record: Message, live: bool = False) -> None:
        try:
            message = decode(ACTUATOR_STATE, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if isinstance(message, ActionIntent):
            if message.action_id not in self.executed:
                self.unfinished[message.action_id] = message.decision
                self._remember(message.job_id, message.action_id, message.decision.kind.value,
                               started_incarnations(message.decision))
        elif isinstance(message, ActionDone):
            self.executed.add(message.action_id)
            self.unfinished.pop(message.action_id, None)
            if message.kind == DecisionKind.START_JOB.value and message.spec is not None:
                try:
                    self._job(message.job_id, message.spec, message.instances, message.settings_args, message.time)
                except SettingsError:
                    pass  # a refused start (_refuse_start): nothing of it runs
            self._remember(message.job_id, message.action_id, message.kind, message.incarnations)
            if message.kind in (DecisionKind.FAIL_JOB.value, DecisionKind.COMPLETE_JOB.value):
                self.jobs.pop(message.job_id, None)
                self.cluster.placement.pop(message.job_id, None)
                self.incarnations.pop(message.job_id, None)
                self.restart_ids.pop(message.job_id, None)
        elif isinstance(message, StackReportReady):
            self.reported.add(message.report_id)
        elif isinstance(message, NodeState):
            if message.state != NodeStatus.LOST.value:
                # A loss is an observation, not an operator's or a rule's word on
                # isolation: an isolated node that is lost comes back isolated.
                self.cluster.set_isolated(message.node, message.state == NodeStatus.ISOLATED.value, message.reason)
                if live:
                    self._node_state_in_engines(message)
            self._record_node_event(message)

    def _remember(self, job_id: str, action_id: str, kind: str, started: Sequence[tuple[str, int, int]]) -> None:
        """What an intent or done record says of its job: the newest
        incarnation of each instance (start indexes only grow), and the job
        restarts; handed to the job's runtime and supervisor."""
        newest = self.incarnations.setdefault(job_id, {})
        for name, round_, start in started:
            if (round_, start) > newest.get(name, (-1, -1)):
                newest[name] = (round_, start)
        if kind == DecisionKind.RESTART_JOB.value:
            self.restart_ids.setdefault(job_id, set()).add(action_id)
        if job_id in self.jobs:
            self._restore(self.jobs[job_id])

    def _restore(self, supervisor: Supervisor) -> None:
        job_id = supervisor.facts.job_id
        supervisor.runtime.restore(self.incarnations.get(job_id, {}))
        supervisor.count_restarts(self.restart_ids.get(job_id, ()))

    def _node_state_in_engines(self, message: NodeState) -> None:
        """An isolation or uncordon (a rule's or an operator's) is done in
        every runtime's engine that has nodes of its own too."""
        for site in self.sites.values():
            self._apply("", site.node_state(message.node, message.state == NodeStatus.ISOLATED.value,
                                            message.reason))

    def _job(self, job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec], args: str,
             submitted_at: float) -> Supervisor:
        """The job's supervisor, made at its start. Raises SettingsError for
        an arguments string that does not parse: such a job never runs on
        the defaults (the processor fails it; a start saying otherwise is
        refused, ``_refuse_start``)."""
        if job_id not in self.jobs:
            settings = parse_args_string(args)
            site = self.sites.get(spec.runtime)
            if site is None:
                self.say(_unreached(spec.runtime), job_id)
                site = self.sites[registry.FALLBACK.name]
            runtime = site.runtime(JobToRun(job_id, spec, tuple(instances), settings), self.cluster, self.clock)
            facts = JobFacts(job_id=job_id, submitted_at=submitted_at, framework=spec.framework, args=args,
                             instances=len(instances), node_name="")
            self.jobs[job_id] = Supervisor(runtime, self.history, self.reports, facts, node="", clock=self.clock,
                                           executed=self.executed)
            self._restore(self.jobs[job_id])
        return self.jobs[job_id]

    # ------------------------------------------------- what runtimes say

    def _apply(self, job_id: str, events: Sequence[RuntimeEvent]) -> None:
        """What a job's runtime said (runtime/base.py), carried out in its
        order; starts in a row go to each node together (``_send_starts``)."""
        starts: dict[tuple[str, str], list[StartInstance]] = {}
        for event in events:
            if isinstance(event, AgentCommand) and isinstance(event.command, StartInstance):
                starts.setdefault((event.command.node, event.command.job_id), []).append(event.command)
                continue
            self._send_starts(starts)  # before what follows them, as said
            if isinstance(event, AgentCommand):
                self.send_command(event.command)
            elif isinstance(event, DumpsExpected):
                self.reports.expect(event.report_id, job_id, event.node)
            elif isinstance(event, NodeIsolated):
                self.isolate(event.node, True, event.reason)
            elif isinstance(event, WaitingForCapacity):
                self.counters.waiting_for_capacity += 1
            elif isinstance(event, NodeDown):
                # The job's engine hears that a node holding these instances is gone.
                self.counters.nodes_lost += 1
                self.producer.send(EVENTS, job_id, encode(NodeLost(job_id=job_id, time=self.clock(), node=event.node,
                                                                   instances=event.instances)))
            elif isinstance(event, CapacityTaken):
                # The scheduler took the round's capacity back: not a fault.
                self.counters.preemptions += 1
                self.producer.send(EVENTS, job_id, encode(Preempted(job_id=job_id, time=self.clock(),
                                                                    round=event.round, reason=event.reason)))
            elif isinstance(event, JobEvent):
                self.producer.send(EVENTS, job_id, encode(event.event))
            elif isinstance(event, EngineError):
                self.counters.runtime_errors += 1
                self.say(event.text, job_id)
            else:
                raise TypeError(f"a runtime said {event!r}, which is no runtime event (runtime/base.RuntimeEvent)")
        self._send_starts(starts)

    def _send_starts(self, starts: dict[tuple[str, str], list[StartInstance]]) -> None:
        """One message per node and job, up to STARTS_PER_MESSAGE starts
        (a lone start as itself): every agent reads every node's commands,
        and a record costs the same whatever it carries."""
        for (node, job_id), commands in starts.items():
            for at in range(0, len(commands), STARTS_PER_MESSAGE):
                chunk = tuple(commands[at:at + STARTS_PER_MESSAGE])
                self.send_command(chunk[0] if len(chunk) == 1 else StartInstances(node=node, job_id=job_id,
                                                                                   starts=chunk))
        starts.clear()

    def _act(self, supervisor: Supervisor, decision: Decision, **how) -> None:
        """One decision through its runtime; what the runtime said meanwhile
        (its commands) is sent even when the action fails halfway."""
        try:
            supervisor.act(decision, **how)
        finally:
            self._apply(decision.job_id, supervisor.runtime.drain())

    # ------------------------------------------------------------ the loop

    def run_once(self, timeout_s: float = 0.1) -> None:
        now = self.clock()
        if now - self._probe_sent >= PROBE_EVERY_S:
            self.producer.send(NODES, PROBE_NODE, encode(Heartbeat(node=PROBE_NODE, time=now, slots=0,
                                                                    address=self.probe_id)))
            self._probe_sent = now
        for record in self.state_reader.poll(0.0, max_records=5000):
            self._state_record(record, live=True)  # operators' isolate/uncordon
        hearing = bool(self.unfinished) and not self._heard_enough(now)
        # While it waits to have heard every agent, the heartbeats are what it waits on.
        for record in self.heartbeats.poll(timeout_s if hearing else 0.0, max_records=5000):
            self._heartbeat(record)
        self._expire_nodes()
        self.reports.flush_due(self.clock())
        for job_id, supervisor in list(self.jobs.items()):
            self._apply(job_id, supervisor.runtime.poll())
        letters = self.letters.poll(0.0, max_records=500)
        if letters:
            self._dead_letters(letters)
        if self.unfinished:
            if hearing:
                self.producer.flush()
                return
            self._finish_unfinished()
        if not self._backlog:
            self._backlog = self.decisions.poll(timeout_s, max_records=200)
        had = bool(self._backlog)
        while self._backlog:
            try:
                self._decision(self._backlog[0])
            except (BusError, StoreError):
                raise  # it stays first in line: carried out, or finished, once the bus or store is back
            except Exception:
                self._backlog.pop(0)  # recorded as failed and done: never tried again
                raise
            self._backlog.pop(0)
        self.producer.flush()
        if had:
            self.decisions.commit()

    def _heard_enough(self, now: float) -> bool:
        """The heartbeats consumer has been positioned for a while: every live
        agent has said what runs on its node."""
        if self._hearing_since is None:
            if not self.heartbeats.ready():
                return False
            self._hearing_since = now
        return now - self._hearing_since >= HEAR_BEFORE_FINISHING_S

    def _finish_unfinished(self) -> None:
        """Actions left between their intent and their done record, finished
        with the incarnations their decision names (agents ignore a start of
        an incarnation they already run), before any new decision."""
        for action_id, decision in list(self.unfinished.items()):
            if action_id not in self.executed:
                self.counters.finished += 1
                self.say(f"finishing {decision.kind.value} {action_id}, left unfinished by the previous actuator",
                         decision.job_id)
                self._carry_out(decision, finishing=True)
            self.unfinished.pop(action_id, None)

    def close(self) -> None:
        self.producer.flush(5)
        for consumer in (self.decisions, self.letters, self.heartbeats, self.state_reader):
            consumer.close()
        self.producer.close()

    # ---------------------------------------------------------- decisions

    def _decision(self, record: Message) -> None:
        try:
            message = decode(DECISIONS, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if isinstance(message, Recorded):
            self._write([*message.diagnoses, *message.dead_letters])
            return
        decision: Decision = message
        self.counters.decisions += 1
        if decision.action_id in self.executed:
            self.counters.duplicates += 1
            return
        if decision.kind is DecisionKind.START_JOB and decision.spec is None:
            self._dead_letter(record, "start_job without a job spec")
            return
        self._carry_out(decision)

    def _carry_out(self, decision: Decision, finishing: bool = False) -> None:
        """Intent (durable), the action, its commands flushed, done: a crash
        anywhere leaves either no intent (the decision is carried out anew)
        or an intent, which the next actuator finishes."""
        kind = decision.kind
        if not finishing and kind in INTENDED:
            self.producer.send(ACTUATOR_STATE, f"action:{decision.action_id}", encode(ActionIntent(
                action_id=decision.action_id, job_id=decision.job_id, time=self.clock(), decision=decision)))
            self.producer.flush()
            failpoint.reach(f"after-intent:{kind.value}")
        try:
            if kind is DecisionKind.START_JOB:
                try:
                    self._job(decision.job_id, decision.spec, decision.instances, decision.args,
                              decision.detected_at).write_job(JobStatus.RUNNING)
                except SettingsError as exc:
                    self._refuse_start(decision, exc)
            supervisor = self.jobs.get(decision.job_id)
            if supervisor is None and kind is DecisionKind.START_JOB:
                pass  # refused (_refuse_start): nothing starts
            elif supervisor is None:
                # A job this actuator never started: nothing to stop or start
                # here, but the decision is still recorded (and isolation done).
                facts = JobFacts(job_id=decision.job_id, submitted_at=decision.detected_at, framework="",
                                 args=decision.args, instances=0, node_name="")
                self._act(Supervisor(UnplacedRuntime(), self.history, self.reports, facts, node="", clock=self.clock,
                                     executed=self.executed), decision)
            else:
                # A hang's stack report already stored is not replaced by the
                # dumps of instances its first stop ended.
                self._act(supervisor, decision, dump_stacks=decision.action_id not in self.reported)
                if kind in FINAL:
                    supervisor.finish()
                    supervisor.runtime.finish()
                    self._apply(decision.job_id, supervisor.runtime.drain())
        except (BusError, StoreError):
            # Some commands may have left: finished, not redone, once the bus
            # (or the history, written before the first command) is back.
            self.executed.discard(decision.action_id)
            self.unfinished[decision.action_id] = decision
            raise
        except Exception:
            # Recorded as failed (or never begun): neither this actuator nor the next tries it again.
            self.executed.add(decision.action_id)
            self.producer.flush()
            self._done(decision)
            raise
        # Every command on the bus before the action counts as done.
        self.producer.flush()
        failpoint.reach(f"before-done:{kind.value}")
        self._done(decision)

    def _refuse_start(self, decision: Decision, exc: SettingsError) -> None:
        """A start whose arguments string does not parse (a processor of
        another version, say): nothing starts; the job is failed as
        ``invalid_job`` and the refusal, naming the flag, kept as a dead letter."""
        problem = f"{exc}" + (f" (hint: {exc.hint})" if exc.hint else "")
        self.executed.add(decision.action_id)
        self.counters.refused_starts += 1
        self.say(f"refused to start the job: its arguments string does not parse: {problem}", decision.job_id)
        facts = JobFacts(job_id=decision.job_id, submitted_at=decision.detected_at, framework="", args=decision.args,
                         instances=len(decision.instances), node_name="")
        refused = Supervisor(UnplacedRuntime(), self.history, self.reports, facts, node="", clock=self.clock,
                             executed=self.executed)
        refused.write_job(JobStatus.FAILED, reason=Reason.INVALID_JOB.value)
        self._write([dead_letter_row(decision.job_id, "actuator/decisions",
                                     f"start_job refused, not run on the defaults: {problem}", decision.args,
                                     self.clock())])

    def _done(self, decision: Decision) -> None:
        spec = decision.spec if decision.kind is DecisionKind.START_JOB else None
        started = started_incarnations(decision)
        self.producer.send(ACTUATOR_STATE, f"action:{decision.action_id}", encode(ActionDone(
            action_id=decision.action_id, job_id=decision.job_id, time=self.clock(), kind=decision.kind.value,
            spec=spec, instances=decision.instances if spec else (), settings_args=decision.args if spec else "",
            incarnations=started)))
        self._remember(decision.job_id, decision.action_id, decision.kind.value, started)
        if decision.kind in FINAL:
            self.jobs.pop(decision.job_id, None)
            self.incarnations.pop(decision.job_id, None)
            self.restart_ids.pop(decision.job_id, None)

    def _dead_letters(self, records: list[Message]) -> None:
        rows = []
        for record in records:
            try:
                letter: DeadLetterMessage = decode(DEAD_LETTERS, record.value)
            except DecodeError as exc:
                # Not even a dead letter: kept as one, as it came (cut before
                # decoding: a flood of bytes costs what the bound allows).
                value = (record.value or b"")[:DEAD_LETTER_VALUE_CHARS].decode("utf-8", "replace")
                rows.append(dead_letter_row("", "bus/" + record.topic, str(exc), value, self.clock()))
                continue
            rows.append(DeadLetter(time=letter.time, source=f"{letter.service}/{letter.topic}",
                                   job_id=letter.key if letter.topic in (EVENTS, LOGS, DECISIONS) else "",
                                   error=letter.error, payload=letter.value))
        if self._write(rows):
            self.letters.commit()

    def _write(self, rows: list) -> bool:
        if not rows:
            return True
        try:
            self.history.write(rows)
            return True
        except StoreError:
            self.counters.history_errors += 1
            return False

    # -------------------------------------------------------------- nodes

    def _heartbeat(self, record: Message) -> None:
        try:
            beat: Heartbeat = decode(NODES, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if isinstance(beat, StackDumps):
            self.reports.add(beat)
            return
        if beat.node == PROBE_NODE:
            if beat.address == self.probe_id:
                self._probe_seen = max(self._probe_seen, beat.time)
            return
        known = self.cluster.nodes.get(beat.node)
        if (beat.run and self._agent_runs.get(beat.node, beat.run) != beat.run
                and known is not None and known.status is not NodeStatus.LOST):
            self._agent_restarted(beat)
        if beat.run:
            self._agent_runs[beat.node] = beat.run
        changed = self.cluster.heartbeat(beat, arrived_at=self.clock())
        if changed is not None:
            self._node_state(beat.node, changed.value, self.cluster.nodes[beat.node].reason)
        if changed is NodeStatus.LOST:
            self._lost(beat.node)
        self._reconcile(beat)

    def _agent_restarted(self, beat: Heartbeat) -> None:
        """A node's agent came back as a new run before the node timeout (so
        the node is not lost). The instances placed there that the new run
        does not report are gone with the previous run (what it did not keep
        for the new run): lost now, as nothing else would ever report them."""
        self.counters.agent_restarts += 1
        # By instance, not incarnation: this heartbeat may be read after a
        # restart already sent the next one (a new run that took its
        # predecessor's instances back reports in only once the starts sent
        # before it joined are carried out: services/agent.py).
        kept = {(r.job_id, r.instance) for r in beat.running}
        for job_id, instances in self.cluster.on_node(beat.node).items():
            gone = [name for name in instances if (job_id, name) not in kept]
            if gone and job_id in self.jobs:
                self.say(f"the agent of {beat.node} restarted without {', '.join(gone)}: lost with it", job_id)
                self.producer.send(EVENTS, job_id, encode(NodeLost(job_id=job_id, time=self.clock(), node=beat.node,
                                                                   instances=tuple(gone))))

    def _reconcile(self, beat: Heartbeat) -> None:
        """Mark restarted instances running; stop what should not run there:
        one stop per job a heartbeat, each incarnation asked again only after
        RECONCILE_AGAIN_S (its grace runs meanwhile: a stop per incarnation
        per heartbeat made a thousand-wide restart a storm of stops)."""
        now = self.clock()
        strays: dict[str, list[tuple[str, int, int]]] = {}
        for item in beat.running:
            entry = self.jobs.get(item.job_id)
            if entry is not None and entry.runtime.heard(item.instance, item.round, item.start, beat.node):
                entry.mark_running(item.instance, item.round, item.start, beat.time)
                continue
            if self.unfinished:
                # An unfinished action's own stop (with its stack dump) ends
                # the incarnations it is about; the rest once it is finished.
                continue
            key = (beat.node, item.job_id, item.instance, item.round, item.start)
            if now - self._reconciled.get(key, -RECONCILE_AGAIN_S) < RECONCILE_AGAIN_S:
                continue
            self._reconciled[key] = now
            strays.setdefault(item.job_id, []).append((item.instance, item.round, item.start))
        for job_id, incarnations in sorted(strays.items()):
            self.send_command(StopInstances(node=beat.node, job_id=job_id, action_id="reconcile",
                                            instances=tuple(name for name, _, _ in incarnations), grace_s=5.0,
                                            incarnations=tuple(incarnations)))
        # What this node no longer reports needs no stop: forgotten (bounded by what runs).
        reported = {(beat.node, item.job_id, item.instance, item.round, item.start) for item in beat.running}
        for key in [k for k in self._reconciled if k[0] == beat.node and k not in reported]:
            del self._reconciled[key]

    def _expire_nodes(self) -> None:
        now = self.clock()
        if now - self.started_at < self.cluster.node_timeout_s:
            return  # heartbeats of a fresh actuator have not all arrived yet
        if now - self._probe_seen > PROBE_LATE_S:
            self.bus_healthy = False  # our own heartbeat is late: the bus, not the nodes, is in trouble
            return
        if not self.bus_healthy:
            # Back from an outage: every node gets two full timeouts to be heard
            # again; its agent's producer reconnects with its own backoff, after ours.
            self.bus_healthy = True
            for node in self.cluster.nodes.values():
                node.last_seen = max(node.last_seen, now + self.cluster.node_timeout_s)
            return
        for name in self.cluster.expire(now):
            self._node_state(name, NodeStatus.LOST.value, self.cluster.nodes[name].reason)
            self._lost(name)

    def _lost(self, name: str) -> None:
        self.counters.nodes_lost += 1
        for job_id, instances in self.cluster.on_node(name).items():
            self.producer.send(EVENTS, job_id, encode(NodeLost(job_id=job_id, time=self.clock(), node=name,
                                                               instances=tuple(instances))))

    def isolate(self, name: str, isolated: bool, reason: str) -> None:
        self.cluster.set_isolated(name, isolated, reason)
        self._node_state(name, NodeStatus.ISOLATED.value if isolated else NodeStatus.READY.value, reason)

    def _record_node_event(self, message: NodeState) -> None:
        # Every change passes through the state topic (this actuator's own,
        # operators' isolate/uncordon, and all of them again after a restart),
        # so it is recorded here, once per (node, state, time).
        try:
            self.history.write([node_event(message)])
        except StoreError:
            # The history is not the state: a store outage must not stop the actuator.
            self.counters.history_errors += 1

    def _node_state(self, name: str, state: str, reason: str) -> None:
        self.producer.send(ACTUATOR_STATE, f"node:{name}", encode(NodeState(node=name, state=state,
                                                                           time=self.clock(), reason=reason)))

    # ------------------------------------------------------------- output

    def _announce_report(self, ready, report=None) -> None:
        self.producer.send(ACTUATOR_STATE, f"report:{ready.report_id}", encode(ready))

    def send_command(self, command) -> None:
        self.counters.commands += 1
        self.producer.send(COMMANDS, command.node, encode(command))

    def _dead_letter(self, record: Message, error: str) -> None:
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, "actuator", dead_letter(record, "actuator", error, self.clock()))


def _unreached(name: str) -> str:
    """What the actuator says of a job that names a runtime it does not reach."""
    try:
        needs = next(iter(registry.runtime_kind(name).flags(registry.ACTUATOR)), "its options")
    except registry.UnknownRuntime:
        return f"the job asks for runtime {name!r}, which there is not; it runs on the {registry.FALLBACK.name}"
    return (f"the job asks for the {name} runtime, but this actuator has none ({needs}); "
            f"it runs on the {registry.FALLBACK.name}")


def node_states(records: list[Message]) -> dict[str, NodeState]:
    """The latest state of every node, from the actuator's state topic."""
    states: dict[str, NodeState] = {}
    for record in records:
        try:
            message = decode(ACTUATOR_STATE, record.value)
        except DecodeError:
            continue
        if isinstance(message, NodeState):
            states[message.node] = message
    return states


def node_event(message: NodeState) -> NodeEventRecord:
    """The history row of a node state change; the same change is always the same row."""
    event_id = hashlib.sha256(f"{message.node}\0{message.state}\0{message.time!r}".encode()).hexdigest()[:32]
    return NodeEventRecord(event_id=event_id, node_name=message.node, time=message.time, state=message.state,
                           detail=message.reason, updated_at=message.time)
