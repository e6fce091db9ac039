"""The agent's held starts: a start that waits for a stop of its instance (a
hang's stack dump, a grace period) is cancelled by a newer start or by a stop
of its incarnation, and an incarnation never starts after a newer one, nor
twice. Issue 29: two restarts of one instance 23 ms apart during a stack
dump started round 1 after round 2, and the round-0 process outlived its stop."""

from __future__ import annotations

import os
import sys
import time

import pytest

from trainwarden.bus import COMMANDS, EVENTS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import StartInstance, StopInstances
from trainwarden.bus.serde import decode, encode
from trainwarden.events import InstanceSpec, InstanceStarted
from trainwarden.services.agent import Agent

JOB = "held-starts"
SPEC = InstanceSpec(name="worker-0", role="worker", index=0, rank=0)
# Deaf to SIGTERM: its stop lasts the whole grace period, during which starts are held.
PROGRAM = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('up', sys.argv[1], os.getpid(), flush=True); time.sleep(600)")
GRACE_S = 2.0


def _start(round_: int, start: int) -> StartInstance:
    return StartInstance(node="n1", job_id=JOB, action_id=f"{JOB}/worker-0/{round_}/{start}", instance=SPEC,
                         round=round_, start=start, world_size=1, master_addr="127.0.0.1", master_port=29999,
                         command=(sys.executable, "-c", PROGRAM, f"r{round_}"))


def _stop(round_: int, start: int) -> StopInstances:
    return StopInstances(node="n1", job_id=JOB, action_id="stop", instances=("worker-0",), grace_s=GRACE_S,
                         incarnations=(("worker-0", round_, start),))


def _send(bus, *commands) -> None:
    producer = bus.producer()
    for command in commands:
        producer.send(COMMANDS, command.node, encode(command))
    producer.flush()


def _run_until(agent, predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        agent.run_once(0.02)
        found = predicate()
        if found:
            return found
    raise AssertionError(f"timed out waiting for {what}")


def _idle(agent, seconds: float) -> None:
    """The agent's loop for a while: whatever it would still start, it starts."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        agent.run_once(0.05)


class _Started:
    """The incarnations the agent reported started, in order."""

    def __init__(self, bus):
        self.consumer = bus.consumer([EVENTS], None, from_beginning=True)
        self.seen: list[tuple[int, int, int]] = []

    def __call__(self) -> list[tuple[int, int, int]]:
        for record in self.consumer.poll(0.0, max_records=100):
            message = decode(EVENTS, record.value)
            if isinstance(message, InstanceStarted):
                self.seen.append((message.round, message.start, message.pid))
        return self.seen


@pytest.fixture
def agent(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1")
    agent.bus = bus
    agent.started = _Started(bus)
    try:
        _run_until(agent, agent.ready, 10, "the agent's consumer")
        yield agent
    finally:
        agent.started.consumer.close()
        agent.close(grace_s=1.0)


def _round0(agent) -> int:
    _send(agent.bus, _start(0, 0))
    [(_, _, pid)] = _run_until(agent, agent.started, 10, "round 0 started")
    _run_until(agent, lambda: agent.running[(JOB, "worker-0")].tail, 10, "round 0's first line")
    return pid


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_newer_restart_during_a_stop_cancels_the_held_older_start(agent):
    pid0 = _round0(agent)
    # Two restarts of the instance 23 ms apart while round 0's stop is under
    # way: the stop of round 1 (the second restart's) and round 2's start
    # arrive while round 1's start is still held.
    _send(agent.bus, _stop(0, 0), _start(1, 1), _stop(1, 1), _start(2, 2))
    _run_until(agent, lambda: len(agent.started()) >= 2, GRACE_S + 10, "round 2")
    # Round 0 was stopped before round 2 started, and round 1 never starts, even after the grace period.
    assert _gone(pid0), "round 0 outlived its stop"
    _idle(agent, GRACE_S + 1.0)
    assert [(r, s) for r, s, _ in agent.started()] == [(0, 0), (2, 2)]
    assert (agent.running[(JOB, "worker-0")].round, agent.running[(JOB, "worker-0")].start) == (2, 2)
    assert agent.counters.held_starts_cancelled == 1
    assert not list((agent.log_dir / JOB / "worker-0").glob("r1-*"))


def test_a_newer_start_replaces_a_held_one_and_waits_for_the_same_stop(agent):
    pid0 = _round0(agent)
    _send(agent.bus, _stop(0, 0), _start(1, 1), _start(2, 2))
    _run_until(agent, lambda: len(agent.started()) >= 2, GRACE_S + 10, "round 2")
    assert _gone(pid0), "round 2 started while round 0 still ran"
    _idle(agent, 1.0)
    assert [(r, s) for r, s, _ in agent.started()] == [(0, 0), (2, 2)]
    assert agent.counters.held_starts_cancelled == 1


def test_a_stop_of_a_held_start_means_it_never_runs(agent):
    pid0 = _round0(agent)
    _send(agent.bus, _stop(0, 0), _start(1, 1), _stop(1, 1))
    _run_until(agent, lambda: _gone(pid0), GRACE_S + 10, "round 0 stopped")
    _idle(agent, 1.0)
    assert [(r, s) for r, s, _ in agent.started()] == [(0, 0)]
    assert (JOB, "worker-0") not in agent.running and not agent.host._held


def test_a_start_of_an_incarnation_already_started_or_older_is_ignored(agent):
    _send(agent.bus, _start(2, 2))
    _run_until(agent, lambda: agent.started(), 10, "round 2")
    # The same start again (a new actuator finishing a restart), then an older one arriving late.
    _send(agent.bus, _start(2, 2), _start(1, 1))
    _idle(agent, 1.0)
    assert [(r, s) for r, s, _ in agent.started()] == [(2, 2)]
    assert agent.counters.ignored_commands == 2
