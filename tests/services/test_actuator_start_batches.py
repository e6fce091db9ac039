"""A round's starts go to each node in one message, in order, not one per
instance (every agent reads every node's commands); a lone start goes as
itself, and a node with more than STARTS_PER_MESSAGE starts gets several."""

from __future__ import annotations

from trainwarden.bus import COMMANDS, DECISIONS, NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Heartbeat, StartInstance, StartInstances
from trainwarden.bus.serde import decode, encode
from trainwarden.events import Decision, DecisionKind, InstanceSpec, JobSpec, Reason, RoleSpec
from trainwarden.services import actuator_service
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.store import SpoolWriter

T0 = 1_800_000_000.0


def _start_decision(width: int) -> Decision:
    instances = tuple(InstanceSpec(f"worker-{i}", "worker", i, i) for i in range(width))
    return Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="submit", job_id="wide", time=T0,
                    round=0, action_id="start-1", starts=tuple((i.name, 0) for i in instances),
                    spec=JobSpec(roles=(RoleSpec("worker", width, ("sh", "-c", "true")),)), instances=instances,
                    detected_at=T0)


def _commands_after_a_start(tmp_path, width: int, nodes: dict[str, int]) -> list:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    producer = bus.producer()
    clock = [T0]
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=30.0, clock=lambda: clock[0])
    producer.send(DECISIONS, "wide", encode(_start_decision(width)))
    for _ in range(8):  # the agents heard each half second, as they beat
        for node, slots in nodes.items():
            producer.send(NODES, node, encode(Heartbeat(node=node, time=clock[0], slots=slots, address="127.0.0.1")))
        service.run_once(0.0)
        clock[0] += 0.5
    service.close()
    return [decode(COMMANDS, r.value) for r in bus.consumer([COMMANDS], None, True).poll(0.0, max_records=10_000)]


def test_a_rounds_starts_go_to_each_node_in_one_message_in_rank_order(tmp_path):
    sent = _commands_after_a_start(tmp_path, 6, {"a": 3, "b": 3})
    assert all(isinstance(c, StartInstances) for c in sent) and sorted(c.node for c in sent) == ["a", "b"]
    for command in sent:
        assert {s.node for s in command.starts} == {command.node} and command.job_id == "wide"
        ranks = [s.instance.rank for s in command.starts]
        assert ranks == sorted(ranks) and len(ranks) == 3
    assert sorted(s.instance.name for c in sent for s in c.starts) == sorted(f"worker-{i}" for i in range(6))


def test_a_lone_start_goes_as_itself_and_a_crowded_node_gets_several_messages(tmp_path, monkeypatch):
    monkeypatch.setattr(actuator_service, "STARTS_PER_MESSAGE", 2)
    sent = _commands_after_a_start(tmp_path, 5, {"a": 5})
    assert [type(c) for c in sent] == [StartInstances, StartInstances, StartInstance]
    assert [s.instance.name for c in sent for s in (c.starts if isinstance(c, StartInstances) else (c,))] == [
        f"worker-{i}" for i in range(5)]
