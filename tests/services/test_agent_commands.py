"""The agent's start commands judged by offsets, not clocks: a start already
in the commands topic when this run of the agent joined was meant for its
previous run and is not run; one sent after it joined is. Its activity
reports carry silence as a duration."""

from __future__ import annotations

import sys
import time

from msgspec.structs import replace as struct_replace

from trainwarden.bus import COMMANDS, EVENTS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import StartInstance, StopInstances
from trainwarden.bus.serde import decode, encode
from trainwarden.events import InstanceActivity, InstanceSpec
from trainwarden.services.agent import Agent

SPEC = InstanceSpec(name="worker-0", role="worker", index=0, rank=0)


def _send(bus, command) -> None:
    producer = bus.producer()
    producer.send(COMMANDS, command.node, encode(command))
    producer.flush()


def _run_until(agent, predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.run_once(0.02)
        found = predicate()
        if found:
            return found
    raise AssertionError("timed out")


def _start(job_id: str, program: str) -> StartInstance:
    return StartInstance(node="n1", job_id=job_id, action_id=f"start-{job_id}", instance=SPEC, round=0, start=0,
                         world_size=1, master_addr="127.0.0.1", master_port=29998,
                         command=(sys.executable, "-c", program))


def _touch(path) -> str:
    return f"open({str(path)!r}, 'w').close()"


def test_a_start_sent_while_the_agent_was_down_is_not_run_by_its_next_run_but_a_later_one_is(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    first = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1")
    try:
        _run_until(first, first.ready, 10)
        # A command for this node, so that this run commits a position past it.
        _send(bus, StopInstances(node="n1", job_id="other", action_id="stop", instances=()))
        _run_until(first, lambda: first.counters.commands >= 1, 10)
    finally:
        first.close(grace_s=1.0)
    stale, fresh = tmp_path / "stale-ran", tmp_path / "fresh-ran"
    _send(bus, _start("stale", _touch(stale)))  # placed on the heartbeats of the run that just ended
    second = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1")
    try:
        _run_until(second, second.ready, 10)
        _run_until(second, lambda: second.counters.ignored_commands >= 1, 10)
        _send(bus, _start("fresh", _touch(fresh)))
        _run_until(second, fresh.exists, 20)
        assert not stale.exists() and second.counters.starts == 1
    finally:
        second.close(grace_s=1.0)


def test_an_agent_reports_how_long_an_instance_has_been_silent_and_that_it_spoke(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    events = bus.consumer([EVENTS], None, from_beginning=True)
    marker = tmp_path / "ran"
    agent = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1")
    try:
        _run_until(agent, agent.ready, 10)
        program = f"import time; print('up', flush=True); {_touch(marker)}; time.sleep(30)"
        _send(bus, _start("reported", program))
        _run_until(agent, marker.exists, 20)
        reports: list[InstanceActivity] = []

        def reported() -> bool:
            for record in events.poll(0.0, max_records=100):
                message = decode(EVENTS, record.value)
                if isinstance(message, InstanceActivity) and message.instances[0].spoke:
                    reports.append(message)
            return bool(reports)

        _run_until(agent, reported, 10)
        [activity] = reports[-1].instances
        # A duration on the agent's clock (the processor dates it by its own), not a time of day.
        assert activity.spoke is True and 0.0 <= activity.silent_s < 30.0
        assert activity.silent_s == round(reports[-1].time - activity.last_output, 3)
    finally:
        events.close()
        agent.close(grace_s=1.0)


def test_an_agent_runs_each_start_of_a_start_instances_message_for_its_node_and_no_other(tmp_path):
    from trainwarden.bus.messages import StartInstances

    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 4, tmp_path / "logs", address="127.0.0.1")
    marks = [tmp_path / f"ran-{n}" for n in range(3)]
    try:
        _run_until(agent, agent.ready, 10)
        starts = [struct_replace(_start("batch", _touch(marks[n])), action_id=f"batch/worker-{n}/0/0",
                                 instance=InstanceSpec(f"worker-{n}", "worker", n, n)) for n in range(3)]
        starts[2] = struct_replace(starts[2], node="n2")  # not this node's, whatever the envelope says
        _send(bus, StartInstances(node="n1", job_id="batch", starts=tuple(starts)))
        _run_until(agent, lambda: marks[0].exists() and marks[1].exists(), 20)
        assert agent.counters.starts == 2 and not marks[2].exists()
    finally:
        agent.close(grace_s=1.0)
