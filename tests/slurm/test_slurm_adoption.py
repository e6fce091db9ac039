"""An agent adopts the Slurm tasks of its node whatever its pace: a task
whose instance ended before the agent looked, or that started before its
announcement arrived, is still adopted, and its lines and exit reach the
engine (adopt.py, files.py, proof.py, task.py); and a round restarted
before any agent's heartbeat named where its tasks run is still stopped
(runtime.py). No Slurm needed: the task wrappers are processes of this
machine started with the variables srun gives them, the runtime's Slurm is
a stand-in (test_slurm_lone_restart.py); the clock is pinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.test_slurm_lone_restart import _Port, _Slurm
from tests.slurm.test_task_files import ROOT, slurm_env, write_plan
from trainwarden.bus.messages import StopInstances
from trainwarden.events import InstanceStarted
from trainwarden.jobspec import from_command
from trainwarden.runtime.adoption import Adopted
from trainwarden.runtime.slurm.adopt import UNANNOUNCED_S, SlurmTasks, token_digest
from trainwarden.runtime.slurm.files import adopted_name
from trainwarden.runtime.slurm.handoff import TASK_TOKENS
from trainwarden.runtime.slurm.runtime import SlurmSite
from trainwarden.runtime.slurm.task import write_json_atomic

T0 = 1_700_000_000.0
JOB, STEP = 42, 3


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def site(tmp_path):
    for name in ("manifests", "outputs", "control"):
        (tmp_path / name).mkdir()
    return tmp_path


@pytest.fixture
def wrappers():
    """Stand-ins for task wrappers srun started: alive, with the step's tokens and Slurm's ids."""
    started: list[subprocess.Popen] = []

    def wrapper(procid: int, tokens: str = "tok-zero tok-one", step: int = STEP) -> int:
        env = {"PATH": os.environ["PATH"], TASK_TOKENS: tokens, "SLURM_JOB_ID": str(JOB),
               "SLURM_STEP_ID": str(step), "SLURM_PROCID": str(procid)}
        proc = subprocess.Popen(["sleep", "60"], env=env)
        started.append(proc)
        return proc.pid

    yield wrapper
    for proc in started:
        proc.kill()
        proc.wait()


def gone_pid() -> int:
    """The pid of a process that has ended: an instance that ran and exited before its agent looked."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def task_ran_and_ended(site: Path, task: int, instance: str, pid, task_pid: int, lines: str, code: int) -> str:
    """The files task.py leaves of a task whose command has ended: start and
    exit manifests, its output."""
    stem = f"{JOB}.{STEP}.{task}"
    out = site / "outputs" / f"{JOB}-step{STEP}-task{task}.out"
    out.write_text(lines)
    base = {"job_id": JOB, "step_id": STEP, "task_id": task, "restart": 0, "node": "n1", "instance": instance,
            "output": str(out), "task_pid": task_pid}
    write_json_atomic(site / "manifests" / f"{stem}.start.json", {**base, "pid": pid, "output_offset": 0})
    write_json_atomic(site / "manifests" / f"{stem}.exit.json", {**base, "exit_code": code})
    return stem


def announce(tasks: SlurmTasks, instance: str, token: str) -> None:
    tasks.expect("job-1", [(instance, 1, 1, token_digest(token))])


def events_of(items) -> list:
    return [(type(i).__name__, getattr(i, "text", getattr(i, "exit_code", None))) for i in items
            if not isinstance(i, Adopted)]


def test_an_instance_that_ended_before_its_agent_looked_is_adopted_through_its_wrapper_and_its_exit_reported(
        site, wrappers):
    tasks = SlurmTasks(site, "n1", Clock(), "addr")
    announce(tasks, "worker-1", "tok-one")
    stem = task_ran_and_ended(site, 1, "worker-1", gone_pid(), wrappers(1), "resuming at step 5\ndone\n", 0)
    items = tasks.poll()
    [adopted] = [i for i in items if isinstance(i, Adopted)]
    assert (adopted.incarnation.instance, adopted.incarnation.round, adopted.pid) == ("worker-1", 1, 0)
    assert events_of(items) == [("InstanceStarted", None), ("LogLine", "resuming at step 5"),
                                ("LogLine", "done"), ("InstanceExited", 0)]
    # The pid of the gone process is never signalled nor reported: it may be another process's by now.
    assert [i.pid for i in items if isinstance(i, InstanceStarted)] == [0]
    # The wrapper is told it may go.
    assert (site / "manifests" / adopted_name(stem)).exists()


def test_a_command_that_could_not_start_is_adopted_through_its_wrapper_and_its_exit_127_reported(site, wrappers):
    tasks = SlurmTasks(site, "n1", Clock(), "addr")
    announce(tasks, "worker-0", "tok-zero")
    task_ran_and_ended(site, 0, "worker-0", None, wrappers(0), "cannot start\n", 127)
    assert events_of(tasks.poll())[-1] == ("InstanceExited", 127)


def test_a_task_that_started_before_its_announcement_keeps_its_lines_and_exit_until_it_is_adopted(site, wrappers):
    tasks = SlurmTasks(site, "n1", Clock(), "addr")
    task_ran_and_ended(site, 1, "worker-1", gone_pid(), wrappers(1), "one\ntwo\n", 3)
    assert tasks.poll() == [] and tasks.poll() == []  # not announced yet: waits, reads nothing
    announce(tasks, "worker-1", "tok-one")
    assert events_of(tasks.poll()) == [("InstanceStarted", None), ("LogLine", "one"), ("LogLine", "two"),
                                       ("InstanceExited", 3)]


def test_a_wrapper_vouches_only_for_its_own_task(site, wrappers):
    clock = Clock()
    tasks = SlurmTasks(site, "n1", clock, "addr")
    announce(tasks, "worker-1", "tok-one")
    victim = wrappers(1)
    # A manifest naming another task (or step) than the wrapper's own: its token is not this task's to give.
    task_ran_and_ended(site, 0, "worker-1", gone_pid(), victim, "forged\n", 1)
    other_step = wrappers(1, step=STEP + 1)
    stem = f"{JOB}.{STEP}.2"
    write_json_atomic(site / "manifests" / f"{stem}.start.json", {
        "job_id": JOB, "step_id": STEP, "task_id": 2, "node": "n1", "instance": "worker-1",
        "output": str(site / "outputs" / f"{JOB}-step{STEP}-task2.out"), "pid": gone_pid(), "task_pid": other_step})
    assert tasks.poll() == []
    clock.now += UNANNOUNCED_S
    assert tasks.poll() == [] and tasks.refused == 2
    assert tasks.files.running == []  # let go of: never read


def test_a_live_process_without_the_token_is_not_vouched_for_by_a_wrapper(site, wrappers):
    clock = Clock()
    tasks = SlurmTasks(site, "n1", clock, "addr")
    announce(tasks, "worker-1", "tok-one")
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        task_ran_and_ended(site, 1, "worker-1", stranger.pid, wrappers(1), "x\n", 0)
        assert tasks.poll() == []
        clock.now += UNANNOUNCED_S
        assert tasks.poll() == [] and tasks.refused == 1
    finally:
        stranger.kill()
        stranger.wait()


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_wrapper_whose_command_ended_waits_for_its_agent_before_it_exits(tmp_path):
    plan = write_plan(tmp_path, "print('done', flush=True)")
    env = {**slurm_env(tmp_path, procid=1), TASK_TOKENS: "tok-zero tok-one"}
    proc = subprocess.Popen([sys.executable, "-m", "trainwarden.runtime.slurm.task", str(plan)], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        exit_manifest = tmp_path / "man" / f"{JOB}.{STEP}.1.exit.json"
        assert _wait_for(exit_manifest.exists), proc.stderr
        start = json.loads((tmp_path / "man" / f"{JOB}.{STEP}.1.start.json").read_text())
        assert start["task_pid"] == proc.pid  # what vouches for the task once its command is gone
        assert proc.poll() is None, "the wrapper left before its agent adopted the task"
        (tmp_path / "man" / adopted_name(f"{JOB}.{STEP}.1")).touch()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_wrapper_no_agent_adopts_exits_with_its_command(tmp_path):
    plan = write_plan(tmp_path, "pass")
    proc = subprocess.run([sys.executable, "-m", "trainwarden.runtime.slurm.task", str(plan)],
                          env=slurm_env(tmp_path), cwd=ROOT, capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr


def test_a_round_restarted_before_any_heartbeat_is_stopped_where_slurm_put_its_tasks(tmp_path):
    # An instance that fails at once is restarted before its agents' first
    # heartbeat: the others must still be stopped (not run on until a
    # heartbeat shows them, into the next round's checkpoints).
    definition = from_command([sys.executable, "train.py"], 2, "--enable-job-restart=True", "quick", stop_grace_s=2)
    slurm, port = _Slurm(), _Port()
    runtime = port.runtime(definition, "--enable-job-restart=True", SlurmSite(slurm, tmp_path))
    for name in runtime.instance_names:
        runtime.start(name, 0, 0)
    port.turn(runtime)  # the allocation runs on n1..n3: the round's step, task i on node i
    port.commands.clear()
    runtime.stop(runtime.instance_names, incarnations={"worker-0": (0, 0), "worker-1": (0, 0)})
    port.take(runtime.drain())
    stops = sorted((c.node, c.instances, c.incarnations) for c in port.commands if isinstance(c, StopInstances))
    assert stops == [("n1", ("worker-0",), (("worker-0", 0, 0),)), ("n2", ("worker-1",), (("worker-1", 0, 0),))]
