"""``trainwarden actuator``: executes decisions on the cluster.

Consumes decisions (a consumer group), heartbeats and its own state topic.
Each decision is executed through the same ``Actuator`` as in the embedded
run, whose runtime here places instances on ready nodes and sends start/stop
commands to their agents. Executed action ids and node states are written to
the compacted ``trainwarden.actuator`` topic before the decision's offset is
committed: a restarted actuator reads them back and never acts twice. Nodes
that stop sending heartbeats are lost, and every job with instances on them
gets a ``node_lost`` event, so the engine decides what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Optional, Sequence

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
    Message,
)
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import (
    ActionDone,
    DeadLetterMessage,
    Heartbeat,
    NodeState,
    Recorded,
    StackDumps,
    StopInstances,
)
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.engine import JobStatus
from trainwarden.events import Decision, DecisionKind, InstanceSpec, JobSpec, NodeLost, Preempted
from trainwarden.runtime.agents import AgentsRuntime, UnplacedRuntime
from trainwarden.runtime.clock import now as clock_now
from trainwarden.runtime.nodes import Cluster, NodeStatus
from trainwarden.runtime.slurm.cli import SlurmError
from trainwarden.runtime.slurm.parse import NodeState as SlurmNodeState
from trainwarden.runtime.slurm.runtime import REASON_PREFIX as SLURM_REASON
from trainwarden.runtime.slurm.runtime import SlurmRuntime, SlurmSite
from trainwarden.settings import JobSettings, SettingsError, parse_args_string
from trainwarden.store.base import StoreError
from trainwarden.store.records import DeadLetter, NodeEventRecord
from trainwarden.supervision.acting import FINAL, JobFacts, Supervisor
from trainwarden.supervision.stack_reports import StackReports

GROUP = f"{PREFIX}-actuator"
NODE_TIMEOUT_S = 10.0
# The actuator's own heartbeat through the bus: while it does not come back,
# missing heartbeats say nothing about the nodes.
PROBE_NODE = "__actuator_probe__"
PROBE_EVERY_S = 1.0
PROBE_LATE_S = 2.5


@dataclasses.dataclass
class ActuatorCounters:
    decisions: int = 0
    duplicates: int = 0
    commands: int = 0
    waiting_for_capacity: int = 0
    nodes_lost: int = 0
    preemptions: int = 0
    dead_letters: int = 0
    history_errors: int = 0
    slurm_errors: int = 0


class ActuatorService:
    def __init__(self, bus: Bus, history, node_timeout_s: float = NODE_TIMEOUT_S,
                 clock: Callable[[], float] = clock_now, group: str = GROUP, slurm: Optional[SlurmSite] = None,
                 say: Callable[[str, str], None] = lambda text, job_id: None):
        self.history = history
        self.slurm = slurm
        self.say = say
        self.clock = clock
        self.counters = ActuatorCounters()
        self.cluster = Cluster(node_timeout_s)
        self.reports = StackReports(history, clock, announce=self._announce_report)
        self.executed: set[str] = set()
        self.jobs: dict[str, Supervisor] = {}
        self.producer = bus.producer()
        self.state_reader = bus.consumer([ACTUATOR_STATE], None, from_beginning=True)
        self._load_state()
        self.heartbeats = bus.consumer([NODES], None, from_beginning=False)
        self.assigned: list = []
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
        if isinstance(message, ActionDone):
            self.executed.add(message.action_id)
            if message.kind == DecisionKind.START_JOB.value and message.spec is not None:
                self._job(message.job_id, message.spec, message.instances, message.settings_args, message.time)
            if message.kind in (DecisionKind.FAIL_JOB.value, DecisionKind.COMPLETE_JOB.value):
                self.jobs.pop(message.job_id, None)
                self.cluster.placement.pop(message.job_id, None)
        elif isinstance(message, NodeState):
            if message.state != NodeStatus.LOST.value:
                # A loss is an observation, not an operator's or a rule's word on
                # isolation: an isolated node that is lost comes back isolated.
                self.cluster.set_isolated(message.node, message.state == NodeStatus.ISOLATED.value, message.reason)
                if live and self.slurm is not None:
                    self._slurm_node(message)
            self._record_node_event(message)

    def _slurm_node(self, message: NodeState) -> None:
        """An isolation or uncordon (a rule's or an operator's) of a Slurm node is done in Slurm too."""
        cli = self.slurm.cli
        try:
            node = cli.node(message.node)
            if node is None:
                return  # not a Slurm node
            drained = node.drain or node.state in (SlurmNodeState.DRAINED, SlurmNodeState.DRAINING)
            if message.state == NodeStatus.ISOLATED.value and not drained:
                cli.drain(message.node, f"{SLURM_REASON}: {message.reason or 'isolated'}")
            elif message.state == NodeStatus.READY.value and drained and node.reason.startswith(SLURM_REASON):
                cli.resume(message.node)  # only what Trainwarden drained
        except SlurmError as exc:
            self.slurm_error("", str(exc))

    def _job(self, job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec], args: str,
             submitted_at: float) -> Supervisor:
        if job_id not in self.jobs:
            try:
                settings = parse_args_string(args)
            except SettingsError:
                settings = JobSettings()
            if spec.runtime == "slurm" and self.slurm is not None:
                runtime = SlurmRuntime(self, job_id, spec, instances, settings, self.slurm)
            else:
                if spec.runtime == "slurm":
                    self.say("the job asks for Slurm, but this actuator has none (--slurm-dir); "
                             "it runs on the agents", job_id)
                runtime = AgentsRuntime(self, job_id, spec, instances, settings)
            facts = JobFacts(job_id=job_id, submitted_at=submitted_at, framework="", args=args,
                             instances=len(instances), node_name="")
            self.jobs[job_id] = Supervisor(runtime, self.history, self.reports, facts, node="", clock=self.clock,
                                           executed=self.executed)
        return self.jobs[job_id]

    # ------------------------------------------------- what runtimes ask (ClusterPort)

    def expect_dumps(self, report_id: str, job_id: str, node: str) -> None:
        self.reports.expect(report_id, job_id, node)

    def no_capacity(self) -> None:
        self.counters.waiting_for_capacity += 1

    def node_lost(self, job_id: str, node: str, instances: Sequence[str]) -> None:
        """The job's engine hears that a node holding these instances is gone (Slurm says it is down)."""
        self.counters.nodes_lost += 1
        self.producer.send(EVENTS, job_id, encode(NodeLost(job_id=job_id, time=self.clock(), node=node,
                                                           instances=tuple(instances))))

    def preempted(self, job_id: str, round_: int, reason: str) -> None:
        """The job's engine hears that the scheduler took the round's capacity back (not a fault)."""
        self.counters.preemptions += 1
        self.producer.send(EVENTS, job_id, encode(Preempted(job_id=job_id, time=self.clock(), round=round_,
                                                            reason=reason)))

    def slurm_error(self, job_id: str, text: str) -> None:
        self.counters.slurm_errors += 1
        self.say(text, job_id)

    # ------------------------------------------------------------ the loop

    def run_once(self, timeout_s: float = 0.1) -> None:
        now = self.clock()
        if now - self._probe_sent >= PROBE_EVERY_S:
            self.producer.send(NODES, PROBE_NODE, encode(Heartbeat(node=PROBE_NODE, time=now, slots=0,
                                                                    address=self.probe_id)))
            self._probe_sent = now
        for record in self.state_reader.poll(0.0, max_records=5000):
            self._state_record(record, live=True)  # operators' isolate/uncordon
        for record in self.heartbeats.poll(0.0, max_records=5000):
            self._heartbeat(record)
        self._expire_nodes()
        self.reports.flush_due(self.clock())
        for supervisor in list(self.jobs.values()):
            supervisor.runtime.retry_waiting()
        letters = self.letters.poll(0.0, max_records=500)
        if letters:
            self._dead_letters(letters)
        records = self.decisions.poll(timeout_s, max_records=200)
        for record in records:
            self._decision(record)
        self.producer.flush()
        if records:
            self.decisions.commit()

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
        if decision.kind is DecisionKind.START_JOB:
            if decision.spec is None:
                self._dead_letter(record, "start_job without a job spec")
                return
            self._job(decision.job_id, decision.spec, decision.instances, decision.args,
                      decision.detected_at).write_job(JobStatus.RUNNING)
        supervisor = self.jobs.get(decision.job_id)
        if supervisor is None:
            # A job this actuator never started: nothing to stop or start
            # here, but the decision is still recorded (and isolation done).
            facts = JobFacts(job_id=decision.job_id, submitted_at=decision.detected_at, framework="",
                             args=decision.args, instances=0, node_name="")
            Supervisor(UnplacedRuntime(self), self.history, self.reports, facts, node="", clock=self.clock,
                       executed=self.executed).act(decision)
        else:
            supervisor.act(decision)
            if decision.kind in FINAL:
                supervisor.finish()
                supervisor.runtime.finish()
        self._done(decision)

    def _done(self, decision: Decision) -> None:
        spec = decision.spec if decision.kind is DecisionKind.START_JOB else None
        self.producer.send(ACTUATOR_STATE, f"action:{decision.action_id}", encode(ActionDone(
            action_id=decision.action_id, job_id=decision.job_id, time=self.clock(), kind=decision.kind.value,
            spec=spec, instances=decision.instances if spec else (), settings_args=decision.args if spec else "")))
        if decision.kind in FINAL:
            self.jobs.pop(decision.job_id, None)

    def _dead_letters(self, records: list[Message]) -> None:
        rows = []
        for record in records:
            try:
                letter: DeadLetterMessage = decode(DEAD_LETTERS, record.value)
            except DecodeError as exc:
                # Not even a dead letter: kept as one, as it came.
                rows.append(DeadLetter(time=self.clock(), source="bus/" + record.topic, job_id="",
                                       error=str(exc)[:2000],
                                       payload=(record.value or b"")[:16000].decode("utf-8", errors="replace")))
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
        changed = self.cluster.heartbeat(beat)
        if changed is not None:
            self._node_state(beat.node, changed.value, self.cluster.nodes[beat.node].reason)
        if changed is NodeStatus.LOST:
            self._lost(beat.node)
        self._reconcile(beat)

    def _reconcile(self, beat: Heartbeat) -> None:
        """Mark restarted instances running; stop what should not run there."""
        for item in beat.running:
            entry = self.jobs.get(item.job_id)
            if entry is not None and entry.runtime.heard(item.instance, item.round, item.start, beat.node):
                entry.mark_running(item.instance, item.round, item.start, beat.time)
                continue
            self.send_command(StopInstances(node=beat.node, job_id=item.job_id, action_id="reconcile",
                                            instances=(item.instance,), grace_s=5.0,
                                            incarnations=((item.instance, item.round, item.start),)))

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
