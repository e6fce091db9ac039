"""An agent ships each job's lines of a turn in one message, whatever the
number of its instances there, in order, and splits only a turn too large for
one message (never one incarnation's part)."""

from __future__ import annotations

from trainwarden.bus import LOGS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import NodeLogBatch
from trainwarden.bus.serde import decode
from trainwarden.events import LogLine
from trainwarden.runtime.nodehost import Running
from trainwarden.services import agent as agent_module
from trainwarden.services.agent import Agent

T0 = 1_800_000_000.0


def _agent(tmp_path) -> tuple[MemoryBus, Agent]:
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    return bus, Agent(bus, "n1", 8, tmp_path / "logs", address="127.0.0.1")


def _printing(agent: Agent, job_id: str, instance: str, *texts: str) -> None:
    """An incarnation followed by the agent's host, with lines not handed out yet."""
    running = Running(job_id=job_id, instance=instance, round=0, start=0)
    running.batch = [LogLine(job_id=job_id, time=T0 + i, instance=instance, round=0, start=0, text=text)
                     for i, text in enumerate(texts)]
    agent.host.running[(job_id, instance)] = running


def _shipped(bus: MemoryBus) -> list[NodeLogBatch]:
    return [decode(LOGS, r.value) for r in bus.consumer([LOGS], None, from_beginning=True).poll(0.1, 10_000)]


def test_a_turn_ships_one_message_per_job_with_a_part_per_instance_in_order(tmp_path):
    bus, agent = _agent(tmp_path)
    try:
        for rank in range(3):
            _printing(agent, "wide", f"worker-{rank}", f"step 1 rank {rank}", f"step 2 rank {rank}")
        _printing(agent, "other", "worker-0", "hello")
        agent.host.ship()
        agent.producer.flush()
        messages = _shipped(bus)
        assert sorted(m.job_id for m in messages) == ["other", "wide"]
        assert all(isinstance(m, NodeLogBatch) and m.node == "n1" for m in messages)
        [wide] = [m for m in messages if m.job_id == "wide"]
        assert [(p.instance, [line.text for line in p.lines]) for p in wide.parts] == [
            (f"worker-{rank}", [f"step 1 rank {rank}", f"step 2 rank {rank}"]) for rank in range(3)]
        agent.host.ship()  # nothing new: nothing sent
        agent.producer.flush()
        assert len(_shipped(bus)) == 2
    finally:
        agent.close(grace_s=0.1)


def test_a_turn_larger_than_one_message_is_split_between_parts_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_module, "SHIP_CHARS", 100)
    bus, agent = _agent(tmp_path)
    try:
        for rank in range(3):
            _printing(agent, "wide", f"worker-{rank}", "x" * 60)  # two parts would be 120 characters
        _printing(agent, "wide", "worker-3", "y" * 500)  # alone over the bound: one part, whole
        agent.host.ship()
        agent.producer.flush()
        messages = _shipped(bus)
        assert [[p.instance for p in m.parts] for m in messages] == [
            ["worker-0"], ["worker-1"], ["worker-2"], ["worker-3"]]
        assert messages[-1].parts[0].lines[0].text == "y" * 500
    finally:
        agent.close(grace_s=0.1)
