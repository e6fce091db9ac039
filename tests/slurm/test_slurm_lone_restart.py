"""Restarting one instance on the ``slurm`` runtime, without Slurm: the
step of its own it gets (one task, on the node it ran on, beside the
round's step), the plan it carries, and the environment task.py gives it
from that plan -- the rank, world size and master of its task in the
round's step, not those of task 0 of a one-task step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.test_slurm_parse import STEP_ENV
from tests.slurm.test_task_files import run_task
from trainwarden.bus.messages import ExpectTasks
from trainwarden.jobspec import from_command
from trainwarden.runtime.base import AgentCommand, Capability, EngineError, JobToRun
from trainwarden.runtime.nodes import Cluster, master_port
from trainwarden.runtime.slurm.adopt import token_digest
from trainwarden.runtime.slurm.parse import JobState, SlurmJob, round_task_env, torch_env_from_slurm
from trainwarden.runtime.slurm.runtime import SlurmRuntime, SlurmSite
from trainwarden.settings import parse_args_string

ROOT = Path(__file__).resolve().parents[2]
NODES = ("n1", "n2", "n3")


# ------------------------------------------------------------ the Slurm variables of a round's task

def _srun_task(index: int, nodes=NODES) -> dict[str, str]:
    """What srun gives task ``index`` of a round's step (one task per node), as in a real one."""
    count = str(len(nodes))
    return {"SLURM_PROCID": str(index), "SLURM_NODEID": str(index), "SLURM_LOCALID": "0",
            "SLURM_STEP_NUM_TASKS": count, "SLURM_STEP_NUM_NODES": count,
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{count})", "SLURM_STEP_NODELIST": "n[1-3]"}


def test_the_variables_of_a_rounds_task_are_those_srun_gives_it():
    as_task = round_task_env(0, ("n1", "n2"))
    assert as_task == {key: STEP_ENV[key] for key in as_task}


def test_a_lone_task_gets_the_torch_variables_its_task_had_in_the_rounds_step():
    lone_step = {"SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "1",
                 "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NODELIST": "n2"}
    for index in range(3):
        as_task = {**lone_step, **round_task_env(index, NODES)}
        assert torch_env_from_slurm(as_task, None, 29600) == torch_env_from_slurm(_srun_task(index), None, 29600)
    env = torch_env_from_slurm({**lone_step, **round_task_env(1, NODES)}, None, 29600)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == (
        "1", "3", "0", "1", "n1")
    # Without it, the lone task would be rank 0 of a world of one, its own master.
    alone = torch_env_from_slurm(lone_step, None, 29600)
    assert (alone["RANK"], alone["WORLD_SIZE"], alone["MASTER_ADDR"]) == ("0", "1", "n2")
    assert round_task_env(0, ("n4",))["SLURM_STEP_TASKS_PER_NODE"] == "1"
    with pytest.raises(ValueError):
        round_task_env(3, NODES)


def _lone_plan(tmp_path: Path, as_task) -> Path:
    code = ("import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'], "
            "os.environ['NODE_RANK'], os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'], "
            "os.environ['TRAINWARDEN_INSTANCE'])")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({
        "instances": [{"name": "worker-1", "command": [sys.executable, "-c", code],
                       "env": {"TRAINWARDEN_INSTANCE": "worker-1"}, "as_task": as_task}],
        "master_addr": None, "master_port": 29555, "manifest_dir": str(tmp_path / "man"),
        "output_dir": str(tmp_path / "out")}))
    return path


def _lone_step_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(PYTHONPATH=str(ROOT / "pipeline"), SLURM_JOB_ID="42", SLURM_STEP_ID="5", SLURM_PROCID="0",
               SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="1", SLURM_STEP_NUM_TASKS="1",
               SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_STEP_NODELIST="n2",
               SLURMD_NODENAME="n2",
               # No scontrol: the master is the name of the round's first node.
               PATH="/nonexistent-bin")
    return env


def test_the_task_wrapper_runs_a_lone_instance_as_its_task_in_the_round_and_files_it_under_its_own_step(tmp_path):
    proc = run_task(_lone_plan(tmp_path, round_task_env(1, NODES)), _lone_step_env())
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.split() == ["1", "3", "n1", "1", "1", "3", "worker-1"]
    # Manifests and output are the real step's (5, task 0): no collision with the round's step.
    start = json.loads((tmp_path / "man" / "42.5.0.start.json").read_text())
    assert (start["step_id"], start["task_id"], start["instance"], start["node"]) == (5, 0, "worker-1", "n2")
    assert start["output"] == str(tmp_path / "out" / "42-step5-task0.out")
    assert (tmp_path / "man" / "42.5.0.exit.json").exists()


@pytest.mark.parametrize("as_task", [["SLURM_PROCID"], {"RANK": "1"}, {"SLURM_PROCID": 1}])
def test_a_plan_whose_as_task_is_not_slurm_variables_is_refused(tmp_path, as_task):
    proc = run_task(_lone_plan(tmp_path, as_task), _lone_step_env())
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "as_task" in err and out == "", err


# ------------------------------------------------------------ the runtime, on a Slurm that records

class _Srun:
    def __init__(self):
        self.killed = False

    def poll(self):
        return -9 if self.killed else None

    def kill(self):
        self.killed = True


class _Slurm:
    run_as = None  # the steps run as the actuator's user

    def __init__(self):
        self.steps: list[dict] = []

    def allocate(self, name, nodes, *, exclude=(), output_dir):
        return 7

    def job(self, job_id):
        return SlurmJob(job_id, "tw", JobState.RUNNING, NODES, 0, "None", (), None)

    def launch_step(self, job_id, tasks, command, **kwargs):
        self.steps.append({"job": job_id, "tasks": tasks, "plan": json.loads(Path(command[-1]).read_text()),
                           "proc": _Srun(), **kwargs})
        return self.steps[-1]["proc"]

    def nodes(self):
        return []

    def drain(self, node, reason):
        pass


class _Port:
    """The actuator's side of a Slurm runtime, as a test holds it: the node
    table, a pinned clock, and the commands the runtime said (runtime/base.py
    events); an engine error fails the test."""

    def __init__(self):
        self.cluster = Cluster(5.0)
        self.now = 1000.0
        self.commands = []

    def clock(self):
        return self.now

    def runtime(self, definition, args: str, site: SlurmSite) -> SlurmRuntime:
        job = JobToRun(definition.job_id, definition.spec(), tuple(definition.instances()), parse_args_string(args))
        return SlurmRuntime(job, self.cluster, self.clock, site)

    def take(self, events) -> None:
        for event in events:
            if isinstance(event, EngineError):
                raise AssertionError(event.text)
            if isinstance(event, AgentCommand):
                self.commands.append(event.command)

    def turn(self, runtime: SlurmRuntime) -> None:
        """One turn of the actuator's loop."""
        self.take(runtime.poll())


@pytest.fixture
def async_job(tmp_path):
    definition = from_command([sys.executable, "train.py"], 3, "--job-execution-mode=Async", "lone", stop_grace_s=2)
    slurm, port = _Slurm(), _Port()
    runtime = port.runtime(definition, "--job-execution-mode=Async", SlurmSite(slurm, tmp_path))
    for name in runtime.instance_names:
        runtime.start(name, 0, 0)  # the allocation is asked for
    port.turn(runtime)  # ... and runs: the round's step
    [round_step] = slurm.steps
    assert round_step["tasks"] == 3 and not round_step.get("overlap") and not round_step.get("nodelist")
    for name, node in zip(runtime.instance_names, NODES):
        runtime.heard(name, 0, 0, node)
    return runtime, slurm, port


def test_restarting_one_instance_starts_it_alone_on_its_node_beside_the_rounds_step(async_job):
    runtime, slurm, port = async_job
    assert Capability.RESTART_INSTANCE in runtime.capabilities
    port.take(runtime.drain())
    port.commands.clear()
    runtime.stop(["worker-1"])
    runtime.start("worker-1", 0, 1)
    [_, lone] = slurm.steps
    assert (lone["job"], lone["tasks"], lone["nodelist"], lone["overlap"]) == (7, 1, ["n2"], True)
    [inst] = lone["plan"]["instances"]
    assert inst["name"] == "worker-1" and inst["as_task"] == round_task_env(1, NODES)
    env = inst["env"]
    assert (env["TRAINWARDEN_INSTANCE"], env["ROLE_RANK"], env["TRAINWARDEN_RESTART_ROUND"],
            env["TRAINWARDEN_INSTANCE_RESTARTS"], env["TRAINWARDEN_RESUME"]) == ("worker-1", "1", "0", "1", "1")
    assert "RANK" not in env and "WORLD_SIZE" not in env  # task.py's, from as_task
    assert lone["plan"]["master_port"] == master_port("lone", 0)
    # Announced alone, with the token of its own incarnation.
    port.take(runtime.drain())
    stop, expect = port.commands
    assert stop.instances == ("worker-1",) and stop.node == "n2"
    assert isinstance(expect, ExpectTasks) and [i[:3] for i in expect.incarnations] == [("worker-1", 0, 1)]
    assert expect.incarnations[0][3] == token_digest(env["TRAINWARDEN_TOKEN"])
    # The round's step runs on for the others, however long the lone restart takes.
    port.now += 3600
    port.turn(runtime)
    assert not slurm.steps[0]["proc"].killed and len(slurm.steps) == 2


def test_a_lone_restart_avoids_an_isolated_node_and_a_stopped_lone_step_is_ended(async_job):
    runtime, slurm, port = async_job
    runtime.isolate_node("n2", "c4d_error")
    runtime.stop(["worker-1"])
    runtime.start("worker-1", 0, 1)
    lone = slurm.steps[-1]
    assert lone["nodelist"] == ["n1"] and lone["plan"]["instances"][0]["as_task"]["SLURM_PROCID"] == "1"
    runtime.stop(["worker-1"])
    port.now += 3600
    port.turn(runtime)
    assert lone["proc"].killed and not slurm.steps[0]["proc"].killed


def test_a_round_still_waits_for_all_its_instances_and_runs_them_in_one_step(async_job):
    runtime, slurm, port = async_job
    runtime.stop(runtime.instance_names)
    for name in runtime.instance_names[:2]:
        runtime.start(name, 1, 0)
        port.turn(runtime)
    assert len(slurm.steps) == 1  # no lone steps: the round is being asked for
    runtime.start("worker-2", 1, 0)
    assert [s["tasks"] for s in slurm.steps] == [3, 3]
    assert "as_task" not in json.dumps(slurm.steps[-1]["plan"])
    port.now += 3600
    port.turn(runtime)
    assert slurm.steps[0]["proc"].killed and not slurm.steps[1]["proc"].killed
