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
import time
from typing import Callable, Sequence

from trainwarden.actuator import Actuator
from trainwarden.bus import (
    ACTUATOR_STATE,
    COMMANDS,
    DEAD_LETTERS,
    DECISIONS,
    EVENTS,
    NODES,
    PREFIX,
    Bus,
    BusError,
    Message,
)
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import (
    ActionDone,
    Heartbeat,
    NodeState,
    StackDumps,
    StartInstance,
    StopInstances,
)
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.events import Decision, DecisionKind, ErrorSource, InstanceSpec, JobSpec, NodeLost
from trainwarden.runtime.clock import now as clock_now
from trainwarden.services.nodes import Cluster, NoCapacity, NodeStatus, master_port
from trainwarden.services.stack_reports import StackReports
from trainwarden.settings import JobSettings, SettingsError, parse_args_string
from trainwarden.store.base import StoreError
from trainwarden.store.records import JobRecord, NodeEventRecord

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
    dead_letters: int = 0
    history_errors: int = 0


class RemoteJobRuntime:
    """One job's instances on the cluster, as the Actuator sees a runtime."""

    def __init__(self, service: "ActuatorService", job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec],
                 settings: JobSettings, args: str = "", framework: str = ""):
        self.service = service
        self.job_id = job_id
        self.args = args
        self.framework = framework
        self.spec = spec
        self.specs = {i.name: i for i in instances}
        self.settings = settings
        self.instance_names = list(self.specs)
        self.incarnation: dict[str, tuple[int, int]] = {}
        self.waiting: list[tuple[str, int, int]] = []  # starts waiting for a free slot
        self.snapshot_report = ""  # set while a hang's restart stops the instances

    def start(self, name: str, round_: int, start: int) -> int:
        self.incarnation[name] = (round_, start)
        try:
            self._send_start(name, round_, start)
        except NoCapacity:
            self.service.counters.waiting_for_capacity += 1
            self.waiting.append((name, round_, start))
        return 0

    def retry_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for name, round_, start in waiting:
            if self.incarnation.get(name) == (round_, start):
                self.start(name, round_, start)

    def _send_start(self, name: str, round_: int, start: int) -> None:
        cluster = self.service.cluster
        node = cluster.place(self.job_id, name, self.service.clock())
        rank0 = min(self.specs.values(), key=lambda s: s.rank).name
        master_node = cluster.placement.get(self.job_id, {}).get(rank0, node.name)
        role = next(r for r in self.spec.roles if r.name == self.specs[name].role)
        env = dict(self.spec.env)
        env.update(dict(role.env))
        if self.settings.enable_c4d_hang_detection:
            env.update(self.settings.c4d_env())
        self.service.send_command(StartInstance(
            node=node.name, job_id=self.job_id, action_id=f"{self.job_id}/{name}/{round_}/{start}",
            instance=self.specs[name], round=round_, start=start, world_size=len(self.specs),
            master_addr=cluster.nodes[master_node].address if master_node in cluster.nodes else node.address,
            master_port=master_port(self.job_id, round_), command=role.command, env=tuple(sorted(env.items())),
            workdir=self.spec.workdir, max_restarts=self.settings.max_num_of_job_restart))

    def stop(self, names: Sequence[str]) -> None:
        self.waiting = [w for w in self.waiting if w[0] not in names]
        for node, instances in self.service.cluster.release(self.job_id, list(names)).items():
            targets = tuple((name, *self.incarnation[name]) for name in instances if name in self.incarnation)
            self.service.send_command(StopInstances(node=node, job_id=self.job_id, action_id="stop",
                                                    instances=tuple(instances), grace_s=self.spec.stop_grace_s,
                                                    incarnations=targets, snapshot_report=self.snapshot_report))
            if self.snapshot_report:
                self.service.reports.expect(self.snapshot_report, self.job_id, node)

    def stop_all(self) -> None:
        self.stop(self.instance_names)

    def isolate_node(self, node: str, reason: str) -> bool:
        self.service.isolate(node, True, reason)
        return True


class _Unplaced:
    """The runtime of a job this actuator has no placement for."""

    instance_names: list = []

    def __init__(self, service: "ActuatorService"):
        self.service = service

    def start(self, name: str, round_: int, start: int) -> int:
        return 0

    def stop(self, names: Sequence[str]) -> None:
        pass

    def stop_all(self) -> None:
        pass

    def isolate_node(self, node: str, reason: str) -> bool:
        self.service.isolate(node, True, reason)
        return True


class ActuatorService:
    def __init__(self, bus: Bus, history, node_timeout_s: float = NODE_TIMEOUT_S,
                 clock: Callable[[], float] = clock_now, group: str = GROUP):
        self.history = history
        self.clock = clock
        self.counters = ActuatorCounters()
        self.cluster = Cluster(node_timeout_s)
        self.reports = StackReports(history, clock, announce=self._announce_report)
        self.executed: set[str] = set()
        self.jobs: dict[str, tuple[RemoteJobRuntime, Actuator]] = {}
        self._submitted: dict[str, float] = {}
        self.producer = bus.producer()
        self.state_reader = bus.consumer([ACTUATOR_STATE], None, from_beginning=True)
        self._load_state()
        self.heartbeats = bus.consumer([NODES], None, from_beginning=False)
        self.assigned: list = []
        self.decisions = bus.consumer([DECISIONS], group, from_beginning=True, on_assign=self._on_assign)
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

    def _state_record(self, record: Message) -> None:
        try:
            message = decode(ACTUATOR_STATE, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        if isinstance(message, ActionDone):
            self.executed.add(message.action_id)
            if message.kind == DecisionKind.START_JOB.value and message.spec is not None:
                self._job(message.job_id, message.spec, message.instances, message.settings_args)
            if message.kind in (DecisionKind.FAIL_JOB.value, DecisionKind.COMPLETE_JOB.value):
                self.jobs.pop(message.job_id, None)
                self.cluster.placement.pop(message.job_id, None)
        elif isinstance(message, NodeState):
            if message.state != NodeStatus.LOST.value:
                # A loss is an observation, not an operator's or a rule's word on
                # isolation: an isolated node that is lost comes back isolated.
                self.cluster.set_isolated(message.node, message.state == NodeStatus.ISOLATED.value, message.reason)
            self._record_node_event(message)

    def _job(self, job_id: str, spec: JobSpec, instances: Sequence[InstanceSpec], args: str):
        if job_id not in self.jobs:
            try:
                settings = parse_args_string(args)
            except SettingsError:
                settings = JobSettings()
            runtime = RemoteJobRuntime(self, job_id, spec, instances, settings, args)
            self.jobs[job_id] = (runtime, Actuator(runtime, self.history, "", clock=self.clock,
                                                   executed=self.executed))
        return self.jobs[job_id]

    # ------------------------------------------------------------ the loop

    def run(self, stop: Callable[[], bool]) -> None:
        while not stop():
            try:
                self.run_once()
            except BusError:
                time.sleep(0.5)

    def run_once(self, timeout_s: float = 0.1) -> None:
        now = self.clock()
        if now - self._probe_sent >= PROBE_EVERY_S:
            self.producer.send(NODES, PROBE_NODE, encode(Heartbeat(node=PROBE_NODE, time=now, slots=0,
                                                                    address=self.probe_id)))
            self._probe_sent = now
        for record in self.state_reader.poll(0.0, max_records=5000):
            self._state_record(record)  # operators' isolate/uncordon
        for record in self.heartbeats.poll(0.0, max_records=5000):
            self._heartbeat(record)
        self._expire_nodes()
        self.reports.flush_due(self.clock())
        for runtime, _ in list(self.jobs.values()):
            runtime.retry_waiting()
        records = self.decisions.poll(timeout_s, max_records=200)
        for record in records:
            self._decision(record)
        self.producer.flush()
        if records:
            self.decisions.commit()

    def close(self) -> None:
        self.producer.flush(5)
        for consumer in (self.decisions, self.heartbeats, self.state_reader):
            consumer.close()
        self.producer.close()

    # ---------------------------------------------------------- decisions

    def _decision(self, record: Message) -> None:
        try:
            decision: Decision = decode(DECISIONS, record.value)
        except DecodeError as exc:
            self._dead_letter(record, str(exc))
            return
        self.counters.decisions += 1
        if decision.action_id in self.executed:
            self.counters.duplicates += 1
            return
        if decision.kind is DecisionKind.START_JOB:
            if decision.spec is None:
                self._dead_letter(record, "start_job without a job spec")
                return
            self._job(decision.job_id, decision.spec, decision.instances, decision.args)
            self._write_job(decision, "running")
        entry = self.jobs.get(decision.job_id)
        hung = decision.error_source in (ErrorSource.HANG, ErrorSource.EXIT_HANG) and decision.kind in (
            DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB)
        if entry is not None and hung:
            # The agents dump the stacks before they stop the instances.
            entry[0].snapshot_report = decision.action_id
            self.reports.start(decision)
        if entry is None:
            # A job this actuator never started: nothing to stop or start
            # here, but the decision is still recorded (and isolation done).
            Actuator(_Unplaced(self), self.history, "", clock=self.clock, executed=self.executed).execute(decision)
        else:
            try:
                entry[1].execute(decision)
            finally:
                entry[0].snapshot_report = ""
        if decision.kind in (DecisionKind.FAIL_JOB, DecisionKind.COMPLETE_JOB):
            self._write_job(decision, "failed" if decision.kind is DecisionKind.FAIL_JOB else "succeeded")
            if entry is not None:
                entry[1].finish()
        self._done(decision)

    def _done(self, decision: Decision) -> None:
        entry = self.jobs.get(decision.job_id)
        spec = decision.spec if decision.kind is DecisionKind.START_JOB else None
        self.producer.send(ACTUATOR_STATE, f"action:{decision.action_id}", encode(ActionDone(
            action_id=decision.action_id, job_id=decision.job_id, time=self.clock(), kind=decision.kind.value,
            spec=spec, instances=decision.instances if spec else (), settings_args=decision.args if spec else "")))
        if decision.kind in (DecisionKind.FAIL_JOB, DecisionKind.COMPLETE_JOB) and entry is not None:
            self.jobs.pop(decision.job_id, None)

    def _write_job(self, decision: Decision, status: str) -> None:
        entry = self.jobs.get(decision.job_id)
        runtime = entry[0] if entry else None
        now = self.clock()
        if status == "running":
            self._submitted[decision.job_id] = decision.detected_at
        self.history.write([JobRecord(
            job_id=decision.job_id, submitted_at=self._submitted.get(decision.job_id, decision.detected_at),
            finished_at=0.0 if status == "running" else now, status=status,
            reason="" if status == "running" else decision.reason.value, framework=runtime.framework if runtime else "",
            args=runtime.args if runtime else decision.args, instances=len(runtime.instance_names) if runtime else 0,
            rounds=decision.round, node_name="", updated_at=now)])

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
            expected = entry[0].incarnation.get(item.instance) if entry else None
            if entry is not None and expected is None:
                # A restarted actuator learns where its jobs run from the agents.
                entry[0].incarnation[item.instance] = expected = (item.round, item.start)
                self.cluster.placement.setdefault(item.job_id, {})[item.instance] = beat.node
            placed = self.cluster.placement.get(item.job_id, {}).get(item.instance)
            if expected == (item.round, item.start) and placed == beat.node:
                entry[1].mark_running(item.instance, item.round, item.start, beat.time)
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

    def _announce_report(self, ready) -> None:
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
