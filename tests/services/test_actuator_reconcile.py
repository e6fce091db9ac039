"""Incarnations the agents report that should not run (an old round still
stopping) are stopped by one command per job and heartbeat, each asked
again only after RECONCILE_AGAIN_S: a stop per incarnation per heartbeat
made a thousand-wide restart a storm of stops (15,595 of them in
bench/scale.py at 1,024 instances on 16 agents)."""

from __future__ import annotations

from tests.services.test_actuator_recovery import JOB, Clock, _run
from trainwarden.bus import ACTUATOR_STATE, DECISIONS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import ActionDone, StopInstances
from trainwarden.bus.serde import encode
from trainwarden.events import Decision, DecisionKind, ErrorSource, InstanceSpec, JobSpec, Reason, RoleSpec
from trainwarden.services.actuator_service import HEAR_BEFORE_FINISHING_S, RECONCILE_AGAIN_S, ActuatorService
from trainwarden.store import SpoolWriter

WIDTH = 64
SPEC = JobSpec(roles=(RoleSpec("worker", WIDTH, ("python", "train.py")),), stop_grace_s=3.0)
INSTANCES = tuple(InstanceSpec(f"worker-{i}", "worker", i, i) for i in range(WIDTH))
T0 = 1_800_000_000.0
START = Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="submit", job_id=JOB, time=T0,
                 round=0, action_id="start-1", starts=tuple((s.name, 0) for s in INSTANCES), spec=SPEC,
                 instances=INSTANCES, detected_at=T0)
RESTART = Decision(kind=DecisionKind.RESTART_JOB, reason=Reason.RETRYABLE_FAILURE, rule="retry", job_id=JOB,
                   time=T0 + 10, round=0, action_id="restart-1", error_source=ErrorSource.INSTANCE_EXIT,
                   instance="worker-1", starts=tuple((s.name, 1) for s in INSTANCES), detected_at=T0 + 10)


def _done(decision: Decision, round_: int) -> ActionDone:
    return ActionDone(action_id=decision.action_id, job_id=JOB, time=decision.time, kind=decision.kind.value,
                      spec=SPEC if decision is START else None, instances=INSTANCES if decision is START else (),
                      incarnations=tuple((name, round_, start) for name, start in decision.starts))


def test_a_wide_old_round_still_reported_is_stopped_by_one_command_asked_again_only_after_its_grace(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    producer = bus.producer()
    for decision, round_ in ((START, 0), (RESTART, 1)):
        producer.send(DECISIONS, JOB, encode(decision))
        producer.send(ACTUATOR_STATE, f"action:{decision.action_id}", encode(_done(decision, round_)))
    producer.flush()
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    assert service.unfinished == {}
    # Round 0 is still being stopped on node-a (its agent reports it), round 1 not started yet.
    beats = {"node-a": [(s.name, 0, 0) for s in INSTANCES]}
    sent = _run(service, bus, clock, beats, HEAR_BEFORE_FINISHING_S + 2 * RECONCILE_AGAIN_S)  # beats every 0.5 s
    stops = [c for c in sent if isinstance(c, StopInstances) and c.action_id == "reconcile"]
    assert 2 <= len(stops) <= 3, [len(c.incarnations) for c in stops]  # not 64 per heartbeat
    assert all(sorted(c.incarnations) == sorted((s.name, 0, 0) for s in INSTANCES) for c in stops)
    service.close()
