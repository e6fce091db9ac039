"""A restarted actuator knows each instance's current incarnation from its own
durable records (never from the agents' heartbeats) and finishes an action
its predecessor left between the intent and the done record with the
decision's incarnations. The same on a real broker, with the actuator killed
at each step: tests/cluster/test_actuator_crash_kafka.py."""

from __future__ import annotations

from trainwarden.bus import ACTUATOR_STATE, COMMANDS, DECISIONS, NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import (ActionDone, ActionIntent, Heartbeat, RunningInstance, StartInstance,
                                      StartInstances, StopInstances)
from trainwarden.bus.serde import decode, encode
from trainwarden.events import Decision, DecisionKind, ErrorSource, InstanceSpec, JobSpec, Reason, RoleSpec
from trainwarden.services.actuator_service import HEAR_BEFORE_FINISHING_S, ActuatorService
from trainwarden.store import SpoolWriter

T0 = 1_800_000_000.0
JOB = "recovering"
SPEC = JobSpec(roles=(RoleSpec("worker", 2, ("python", "train.py")),), stop_grace_s=3.0)
INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))
START = Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="submit", job_id=JOB, time=T0,
                 round=0, action_id="start-1", starts=(("worker-0", 0), ("worker-1", 0)), spec=SPEC,
                 instances=INSTANCES, detected_at=T0)
RESTART = Decision(kind=DecisionKind.RESTART_JOB, reason=Reason.RETRYABLE_FAILURE, rule="retry", job_id=JOB,
                   time=T0 + 10, round=0, action_id="restart-1", error_source=ErrorSource.INSTANCE_EXIT,
                   instance="worker-1", starts=(("worker-0", 1), ("worker-1", 1)), detected_at=T0 + 10)


class Clock:
    def __init__(self):
        self.now = T0 + 20

    def __call__(self):
        return self.now


def _bus(*state) -> MemoryBus:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    producer = bus.producer()
    for key, message in state:
        producer.send(ACTUATOR_STATE, key, encode(message))
    producer.send(DECISIONS, JOB, encode(START))
    producer.send(DECISIONS, JOB, encode(RESTART))
    producer.flush()
    # What the first actuator had polled and committed: the start (its done record says so).
    committed = bus.consumer([DECISIONS], "trainwarden-actuator", from_beginning=True)
    committed.poll(0.0, max_records=1)
    committed.commit()
    committed.close()
    return bus


def _started(decision: Decision, round_: int) -> ActionDone:
    return ActionDone(action_id=decision.action_id, job_id=JOB, time=T0, kind=decision.kind.value,
                      spec=SPEC if decision is START else None, instances=INSTANCES if decision is START else (),
                      incarnations=tuple((name, round_, start) for name, start in decision.starts))


def _run(service, bus, clock, beats: dict, seconds: float) -> list:
    """The actuator's loop for ``seconds`` of its clock, every agent beating each second."""
    producer = bus.producer()
    commands = bus.consumer([COMMANDS], None, from_beginning=True)
    sent = []
    end = clock.now + seconds
    while clock.now < end:
        for node, running in beats.items():
            producer.send(NODES, node, encode(Heartbeat(node=node, time=clock.now, slots=4, address="127.0.0.1",
                                                        running=tuple(RunningInstance(JOB, name, r, s, 100 + r)
                                                                      for name, r, s in running))))
        producer.flush()
        service.run_once(0.0)
        clock.now += 0.5
    for record in commands.poll(0.0, max_records=1000):
        command = decode(COMMANDS, record.value)
        # A node's starts of a round come together: one by one here.
        sent.extend(command.starts if isinstance(command, StartInstances) else (command,))
    commands.close()
    return sent


def _stops(sent) -> list:
    return sorted((c.node, c.action_id, c.incarnations) for c in sent if isinstance(c, StopInstances))


def test_a_restart_left_after_its_commands_is_finished_without_touching_the_round_it_started(tmp_path):
    # The predecessor sent the stop of round 0 and the starts of round 1 (running on node-a) and died
    # before its done record.
    bus = _bus((f"action:{START.action_id}", _started(START, 0)),
               (f"action:{RESTART.action_id}", ActionIntent(RESTART.action_id, JOB, T0 + 10, RESTART)))
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    assert list(service.unfinished) == [RESTART.action_id] and service.jobs[JOB].restarts == 1
    running = {"node-a": [("worker-0", 1, 1), ("worker-1", 1, 1)], "node-b": []}
    early = _run(service, bus, clock, running, HEAR_BEFORE_FINISHING_S - 1.0)
    assert early == [], "finished before every agent was heard"
    sent = _run(service, bus, clock, running, 3.0)
    # The stop names round 0 (the decision's), never the round 1 the agents report.
    assert _stops(sent) == [("node-a", "stop", (("worker-0", 0, 0), ("worker-1", 0, 0)))], sent
    starts = sorted((c.node, c.instance.name, c.round, c.start) for c in sent if isinstance(c, StartInstance))
    # The same starts, where they already run: the agent there ignores them.
    assert starts == [("node-a", "worker-0", 1, 1), ("node-a", "worker-1", 1, 1)]
    assert service.unfinished == {} and service.counters.finished == 1
    assert service.counters.duplicates == 1  # the redelivered decision
    assert service.jobs[JOB].restarts == 1
    done = [decode(ACTUATOR_STATE, r.value) for r in bus.consumer([ACTUATOR_STATE], None, True).poll(0.0, 100)]
    assert [m.incarnations for m in done if isinstance(m, ActionDone) and m.action_id == RESTART.action_id] == [
        (("worker-0", 1, 1), ("worker-1", 1, 1))]
    service.close()


def test_a_restart_left_after_its_intent_stops_round_0_where_it_runs_and_starts_round_1_once(tmp_path):
    bus = _bus((f"action:{START.action_id}", _started(START, 0)),
               (f"action:{RESTART.action_id}", ActionIntent(RESTART.action_id, JOB, T0 + 10, RESTART)))
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    running = {"node-a": [("worker-0", 0, 0)], "node-b": [("worker-1", 0, 0)]}
    sent = _run(service, bus, clock, running, HEAR_BEFORE_FINISHING_S + 2.0)
    # Round 0 stopped on both nodes by the action's own stop (which dumps a hang's stacks first): no
    # reconciling stop before it (these agents never stop anything, so reconciling goes on after).
    kinds = [c.action_id for c in sent if isinstance(c, StopInstances)]
    assert kinds[:2] == ["stop", "stop"] and set(kinds[2:]) <= {"reconcile"}, kinds
    assert [s for s in _stops(sent) if s[1] == "stop"] == [("node-a", "stop", (("worker-0", 0, 0),)),
                                                            ("node-b", "stop", (("worker-1", 0, 0),))]
    starts = [(c.instance.name, c.round, c.start) for c in sent if isinstance(c, StartInstance)]
    assert sorted(starts) == [("worker-0", 1, 1), ("worker-1", 1, 1)]
    service.close()


def test_a_new_actuator_stops_a_stale_incarnation_and_keeps_the_current_one_whatever_it_hears_first(tmp_path):
    # The restart is done; an agent still reports a round-0 straggler, and its heartbeat comes first.
    bus = _bus((f"action:{START.action_id}", _started(START, 0)),
               (f"action:{RESTART.action_id}", _started(RESTART, 1)))
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    assert service.unfinished == {} and service.jobs[JOB].restarts == 1
    running = {"node-b": [("worker-0", 0, 0)], "node-a": [("worker-0", 1, 1), ("worker-1", 1, 1)]}
    sent = _run(service, bus, clock, running, 1.0)
    assert {(node, incarnations) for node, _, incarnations in _stops(sent)} == {("node-b", (("worker-0", 0, 0),))}
    assert not [c for c in sent if isinstance(c, StartInstance)]
    service.close()
