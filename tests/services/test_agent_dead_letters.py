"""What a node agent refuses (an SDK request, a C4D line) becomes a dead
letter bounded exactly as ``trainwarden run`` bounds it: one function,
supervision/intake.dead_letter, one set of limits."""

from __future__ import annotations

from trainwarden.bus import DEAD_LETTERS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.serde import decode
from trainwarden.services.agent import Agent
from trainwarden.supervision.intake import MAX_ERROR, MAX_PAYLOAD, refused_request


def _letters(bus):
    return [decode(DEAD_LETTERS, r.value) for r in bus.consumer([DEAD_LETTERS], None, True).poll(0.1)]


def test_an_oversized_refused_sdk_request_is_dead_lettered_with_the_same_bounds_as_in_run(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 1, tmp_path / "logs", address="127.0.0.1", clock=lambda: 5.0)
    reason, raw = "bad frame " + "r" * 3000, b"{" + b"x" * 20000
    try:
        agent.inbox.put(("refused", reason, raw))  # as the SDK endpoint's thread hands it over
        agent.run_once(0.01)
    finally:
        agent.close(grace_s=0.5)
    [letter] = _letters(bus)
    in_run = refused_request("", reason, raw, 5.0)
    assert (letter.topic, letter.error, letter.value) == ("sdk", in_run.error, in_run.payload)
    assert (len(letter.error), len(letter.value)) == (MAX_ERROR, MAX_PAYLOAD)
    assert agent.counters.dead_letters == 1


def test_a_malformed_c4d_line_is_dead_lettered_with_the_same_bounds_as_in_run(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 1, tmp_path / "logs", address="127.0.0.1", clock=lambda: 5.0)
    line = "C4D " + "{" * 20000
    try:
        agent.inbox.put(("c4d", line))  # as the C4D follower's thread hands it over
        agent.run_once(0.01)
    finally:
        agent.close(grace_s=0.5)
    [letter] = _letters(bus)
    assert letter.topic == "c4d" and len(letter.value) == MAX_PAYLOAD and len(letter.error) <= MAX_ERROR


def test_a_malformed_command_keyed_to_another_node_is_left_to_that_nodes_agent(tmp_path):
    from trainwarden.bus import COMMANDS

    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 1, tmp_path / "logs", address="127.0.0.1", clock=lambda: 5.0)
    producer = bus.producer()
    try:
        for _ in range(100):
            agent.run_once(0.02)
            if agent.ready():
                break
        producer.send(COMMANDS, "n2", b"{not json")
        producer.send(COMMANDS, "n1", b"{not json either")
        producer.flush()
        for _ in range(100):
            agent.run_once(0.02)
            if agent.counters.dead_letters:
                break
    finally:
        agent.close(grace_s=0.5)
    [letter] = _letters(bus)
    assert letter.key == "n1" and agent.counters.dead_letters == 1
