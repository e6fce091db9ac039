"""The agent's stops: a second stop of an incarnation whose stack is being
dumped (the actuator reconciling a heartbeat sent meanwhile) must not kill
the processes under the dump."""

from __future__ import annotations

import os
import sys
import time

import pytest

from trainwarden.bus import COMMANDS, NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import StackDumps, StartInstance, StopInstances
from trainwarden.bus.serde import decode, encode
from trainwarden.diagnose.collect import find_tool
from trainwarden.events import InstanceSpec
from trainwarden.services.agent import Agent

JOB = "agent-stops"


@pytest.fixture
def slow_pyspy(tmp_path, monkeypatch):
    real = find_tool("py-spy")
    if real is None:
        pytest.skip("py-spy is not installed (make setup installs the diagnose extra)")
    wrapper = tmp_path / "slow-py-spy"
    # Slow enough that the second stop surely arrives while the dump runs.
    wrapper.write_text(f"#!/bin/sh\nsleep 1.5\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("TRAINWARDEN_PYSPY", str(wrapper))
    monkeypatch.setenv("TRAINWARDEN_STACK_TOOLS", "py-spy")


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


def test_a_reconciling_stop_during_a_hangs_stack_dump_leaves_the_processes_to_the_dump(tmp_path, slow_pyspy):
    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    agent = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1")
    nodes = bus.consumer([NODES], None, from_beginning=True)
    try:
        _run_until(agent, agent.ready, 10)
        spec = InstanceSpec(name="worker-0", role="worker", index=0, rank=0)
        program = "import os, time; print('up', os.getpid(), flush=True); time.sleep(600)"
        _send(bus, StartInstance(node="n1", job_id=JOB, action_id="start", instance=spec, round=1, start=0,
                                 world_size=1, master_addr="127.0.0.1", master_port=29999,
                                 command=(sys.executable, "-c", program)))
        running = _run_until(agent, lambda: agent.running.get((JOB, "worker-0")), 10)
        _run_until(agent, lambda: running.pid and running.tail, 10)
        stop = StopInstances(node="n1", job_id=JOB, action_id="stop", instances=("worker-0",), grace_s=2.0,
                             incarnations=(("worker-0", 1, 0),), snapshot_report="hang-1")
        _send(bus, stop)
        _run_until(agent, lambda: any(t.is_alive() for t in agent.host._stoppers), 5)
        _send(bus, StopInstances(node="n1", job_id=JOB, action_id="reconcile", instances=("worker-0",),
                                 grace_s=2.0, incarnations=(("worker-0", 1, 0),)))

        def dumps():
            for record in nodes.poll(0.0, max_records=100):
                message = decode(NODES, record.value)
                if isinstance(message, StackDumps):
                    return message
            return None

        report = _run_until(agent, dumps, 30)
        assert report.report_id == "hang-1" and report.missing == (), report.missing
        assert f'"pid": {running.pid}' in report.dumps_json or f'"pid":{running.pid}' in report.dumps_json
        _run_until(agent, lambda: (JOB, "worker-0") not in agent.running, 15)
        with pytest.raises(ProcessLookupError):
            os.kill(running.pid, 0)
    finally:
        nodes.close()
        agent.close(grace_s=2.0)


def test_a_stop_of_an_adopted_slurm_task_reaches_it_after_a_newer_incarnation_was_adopted_beside_it(tmp_path):
    # A lone restart's task (srun --overlap) can start, and be adopted, while
    # the incarnation it replaces is still being stopped (a hang's stack dump
    # first) or before the actuator's reconciling stop of it arrives.
    import subprocess

    from trainwarden.bus.messages import ExpectTasks
    from trainwarden.runtime.slurm.adopt import adopter, token_digest
    from trainwarden.runtime.slurm.task import write_json_atomic

    bus = MemoryBus()
    bus.create_topics(topic_specs(1))
    site = tmp_path / "slurm"
    agent = Agent(bus, "n1", 2, tmp_path / "logs", address="127.0.0.1", adopters=[adopter(site, "n1")])
    tasks: list[subprocess.Popen] = []

    def task(step: int, start: int, token: str) -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "600"], env={"PATH": os.environ["PATH"], "TRAINWARDEN_TOKEN": token},
                                start_new_session=True)
        tasks.append(proc)
        _send(bus, ExpectTasks(node="*", job_id=JOB, allocation=5,
                               incarnations=(("worker-0", 0, start, token_digest(token)),)))
        output = site / "outputs" / f"5-step{step}-task0.out"
        for directory in (output.parent, site / "manifests"):
            directory.mkdir(parents=True, exist_ok=True)
        output.touch()
        write_json_atomic(site / "manifests" / f"5.{step}.0.start.json", {
            "job_id": 5, "step_id": step, "task_id": 0, "node": "n1", "instance": "worker-0",
            "output": str(output), "pid": proc.pid, "output_offset": 0})
        return proc

    try:
        _run_until(agent, agent.ready, 10)
        old = task(0, 0, "tok-old")
        _run_until(agent, lambda: agent.running.get((JOB, "worker-0")), 10)
        new = task(1, 1, "tok-new")
        _run_until(agent, lambda: agent.running[(JOB, "worker-0")].start == 1, 10)
        _send(bus, StopInstances(node="n1", job_id=JOB, action_id="reconcile", instances=("worker-0",),
                                 grace_s=2.0, incarnations=(("worker-0", 0, 0),)))
        _run_until(agent, lambda: old.poll() is not None, 15)
        assert new.poll() is None  # the newer incarnation runs on
    finally:
        agent.close(grace_s=2.0)
        for proc in tasks:
            proc.kill()
            proc.wait()
