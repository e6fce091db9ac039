"""SlurmCli, task.py and TaskFiles against the real Slurm of deploy/slurm/local-slurm.

Opt-in: needs TRAINWARDEN_SLURM=1 and SLURM_CONF (``.ci/run`` starts the
cluster and sets both). Nothing here starts the cluster; every job a test
creates is cancelled at the end. The node-failure test kills one slurmd and
takes ~40 s (TRAINWARDEN_SLURM_FAST=1 skips it); it restarts the slurmd with
``local-slurm restart-node`` whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainwarden.runtime.slurm.cli import SlurmCli, SlurmError, SlurmTimeout
from trainwarden.runtime.slurm.files import TaskExited, TaskFiles, TaskLines, TaskStarted
from trainwarden.runtime.slurm.parse import JobState, NodeState

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "local-slurm"
NODES = ("n1", "n2", "n3")

pytestmark = pytest.mark.skipif(
    os.environ.get("TRAINWARDEN_SLURM") != "1" or not os.environ.get("SLURM_CONF"),
    reason="needs a real Slurm cluster: eval \"$(deploy/slurm/local-slurm start)\" and TRAINWARDEN_SLURM=1",
)


@pytest.fixture(scope="module")
def cli():
    c = SlurmCli(timeout_s=20)
    try:
        nodes = c.nodes()
    except SlurmError as e:
        pytest.fail(f"TRAINWARDEN_SLURM=1 but Slurm does not answer: {e}")
    assert sorted(n.name for n in nodes) == list(NODES), "these tests expect local-slurm's nodes n1 n2 n3"
    c.created = []  # type: ignore[attr-defined]
    yield c
    for job_id in c.created:  # type: ignore[attr-defined]
        c.cancel(job_id)
    for n in NODES:
        node = c.node(n)
        if node is not None and node.drain:
            c.resume(n)


@pytest.fixture(autouse=True)
def cancel_this_tests_jobs(cli):
    # Each test starts on idle nodes: a job left running by the one before
    # shares their CPUs and slows the next allocation (CI: a requeued job
    # took over 10 s to run again beside one).
    yield
    for job_id in cli.created:  # type: ignore[attr-defined]
        cli.cancel(job_id)
    cli.created.clear()  # type: ignore[attr-defined]


@pytest.fixture
def work(tmp_path_factory):
    # Under /tmp (not pytest's default if it were elsewhere): the slurmd write the output files.
    return tmp_path_factory.mktemp("slurm")


def running(cli: SlurmCli, job_id: int, timeout_s: float = 15.0):
    try:
        return cli.wait_for(
            lambda: (j := cli.job(job_id)) is not None and j.state is JobState.RUNNING and j,
            timeout_s, interval_s=0.05, what=f"job {job_id} RUNNING",
        )
    except SlurmTimeout as e:
        raise AssertionError(f"{e}\n{slurm_state(job_id)}") from None


def slurm_state(job_id: int) -> str:
    """What Slurm says of its jobs, nodes and the job (its pending reason), and its controller's last lines."""
    def out(*command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        return done.stdout + done.stderr

    log = Path(os.environ["SLURM_CONF"]).parent / "log" / "slurmctld.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    return "\n".join((out("squeue", "-o", "%i %P %T %r %N"), out("sinfo", "-N", "-o", "%N %P %T %E"),
                      out("scontrol", "show", "job", str(job_id)), tail))


def allocate(cli: SlurmCli, work: Path, nodes: int = 2, **kw) -> int:
    job_id = cli.allocate(f"twtest-{work.name}", nodes, output_dir=work / "out", **kw)
    cli.created.append(job_id)  # type: ignore[attr-defined]
    return job_id


def plan(work: Path, code: str, tasks: int = 2) -> Path:
    path = work / f"plan-{time.monotonic_ns()}.json"
    path.write_text(json.dumps({
        "instances": [{"name": f"worker-{i}", "command": [sys.executable, "-c", code], "env": {}} for i in range(tasks)],
        "master_addr": None, "master_port": 29500,
        "manifest_dir": str(work / "manifests"), "output_dir": str(work / "out"),
    }))
    return path


def launch(cli: SlurmCli, job_id: int, work: Path, code: str) -> subprocess.Popen:
    return cli.launch_step(
        job_id, 2, [sys.executable, "-m", "trainwarden.runtime.slurm.task", str(plan(work, code))],
        output_dir=work / "out", env={"PYTHONPATH": str(ROOT / "pipeline")},
    )


def poll_all(files: dict[str, TaskFiles]) -> list:
    return [e for f in files.values() for e in f.poll()]


PRINT = "import os; print('hello', os.environ['SLURMD_NODENAME'], os.environ['RANK'], os.environ['MASTER_ADDR'], flush=True)"
# With proctrack/linuxproc Slurm signals every process of the step, so the
# command gets SIGTERM twice (directly, and forwarded by task.py): the
# handler ignores the second, or it may end the exit with signal 15 (143).
SLEEP = (
    "import os, signal, sys, time\n"
    "def term(*a):\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    print('term', os.environ['RANK'], flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('sleeping', os.environ['RANK'], flush=True)\n"
    "time.sleep(300)\n"
)


def test_allocate_launch_cancel_step_and_launch_again(cli, work):
    t0 = time.monotonic()
    job_id = allocate(cli, work)
    job = running(cli, job_id)
    print(f"allocate -> RUNNING {time.monotonic() - t0:.2f}s")
    assert len(job.nodes) == 2 and set(job.nodes) <= set(NODES)
    files = {n: TaskFiles(work / "manifests", n) for n in NODES}

    t0 = time.monotonic()
    assert launch(cli, job_id, work, PRINT).wait(timeout=30) == 0
    print(f"2-task step, launch to exit {time.monotonic() - t0:.2f}s")
    events = poll_all(files)
    started = [e for e in events if isinstance(e, TaskStarted)]
    assert sorted(e.node for e in started) == sorted(job.nodes)  # distinct nodes, each its own TaskFiles
    assert {e.step_id for e in started} == {0}
    lines = {e.task_id: e.lines for e in events if isinstance(e, TaskLines)}
    by_task = {e.task_id: e.node for e in started}
    assert lines == {t: [f"hello {by_task[t]} {t} 127.0.0.1"] for t in (0, 1)}
    assert sorted(e.exit_code for e in events if isinstance(e, TaskExited)) == [0, 0]
    for t in (0, 1):
        assert (work / "out" / f"{job_id}-step0-task{t}.out").read_text() == f"hello {by_task[t]} {t} 127.0.0.1\n"

    # a long step, stopped with SIGTERM (forwarded by task.py), then a new step in the same allocation
    long = launch(cli, job_id, work, SLEEP)
    # Both tasks have their SIGTERM handler in place once both said so.
    said: list[str] = []

    def both_sleeping():
        said.extend(line for e in poll_all(files) if isinstance(e, TaskLines) for line in e.lines)
        return len([line for line in said if line.startswith("sleeping")]) >= 2 or None

    cli.wait_for(both_sleeping, 20, what="both tasks of the long step printing")
    step = cli.wait_for(lambda: [s for s in cli.steps(job_id) if not s.special], 10, what="the long step listed")[0]
    assert step.step_id == 1 and step.state is JobState.RUNNING
    cli.cancel_steps(job_id, signal="TERM")
    # What counts is how the tasks ended (their exit manifests, below: 0);
    # srun itself sometimes reports 143 for a step signalled with TERM.
    assert long.wait(timeout=20) in (0, 143)
    t0 = time.monotonic()
    assert launch(cli, job_id, work, PRINT).wait(timeout=30) == 0
    print(f"step after a cancelled one, launch to exit {time.monotonic() - t0:.2f}s")
    out = work / "out"
    for t in (0, 1):
        assert (out / f"{job_id}-step0-task{t}.out").read_text().startswith("hello ")  # old files intact
        assert (out / f"{job_id}-step1-task{t}.out").read_text().startswith(f"sleeping {t}\n")
        assert f"term {t}\n" in (out / f"{job_id}-step1-task{t}.out").read_text()
        assert (out / f"{job_id}-step2-task{t}.out").read_text().startswith("hello ")
    events = poll_all(files)
    assert sorted((e.step_id, e.exit_code) for e in events if isinstance(e, TaskExited)) == [(1, 0), (1, 0), (2, 0), (2, 0)]
    assert sum(f.rejected for f in files.values()) == 0
    assert [s for s in cli.steps(job_id) if not s.special] == []


def test_drain_with_spaces_and_resume(cli):
    reason = "Trainwarden isolated: nccl error on rank 3"
    cli.drain("n3", reason)
    try:
        node = cli.node("n3")
        assert node is not None and node.drain and node.state in (NodeState.DRAINED, NodeState.DRAINING)
        assert node.reason == reason
        assert [n.reason for n in cli.nodes() if n.name == "n3"] == [reason]
    finally:
        cli.resume("n3")
    node = cli.wait_for(lambda: (n := cli.node("n3")) and n.state is NodeState.IDLE and not n.drain and n, 10,
                        what="n3 idle again")
    assert node.reason == ""


def test_requeue_now_excluding_a_node_then_cancel(cli, work):
    job_id = allocate(cli, work)
    first = running(cli, job_id)
    bad = first.nodes[0]
    t0 = time.monotonic()
    cli.requeue_now(job_id, exclude=[bad])
    # Under Slurm's own ~120 s hold. The next scheduling pass after the old
    # allocation has completed starts it (~3 s idle); on a loaded host that
    # pass can miss the freed nodes and wait for the periodic one (60 s).
    again = running(cli, job_id, timeout_s=90)
    print(f"requeue_now -> RUNNING {time.monotonic() - t0:.2f}s")
    assert bad not in again.nodes and len(again.nodes) == 2
    assert again.excluded == (bad,)
    assert again.restarts == first.restarts + 1
    cli.cancel(job_id)
    gone = cli.wait_for(lambda: (j := cli.job(job_id)) is None or j.state is JobState.CANCELLED, 15,
                        what=f"job {job_id} cancelled")
    assert gone
    cli.cancel(job_id)  # twice is fine


def local_slurm(*args: str) -> None:
    env = dict(os.environ, SLURM_DIR=str(Path(os.environ["SLURM_CONF"]).parent))
    subprocess.run([str(SCRIPT), *args], env=env, check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(os.environ.get("TRAINWARDEN_SLURM_FAST") == "1", reason="TRAINWARDEN_SLURM_FAST=1")
def test_node_failure_requeues_the_job_slow(cli, work):
    """SLOW (~40 s): kill -9 a slurmd under the allocation; Slurm marks the node down and requeues the job."""
    if not (Path(os.environ["SLURM_CONF"]).parent / ".local-slurm").exists():
        pytest.skip("SLURM_CONF is not a deploy/slurm/local-slurm cluster: will not kill its slurmd")
    job_id = allocate(cli, work)
    job = running(cli, job_id)
    victim = job.nodes[-1]
    t0 = time.monotonic()
    local_slurm("kill-node", victim)
    try:
        down = cli.wait_for(lambda: (n := cli.node(victim)) and n.state is NodeState.DOWN and n, 75, interval_s=0.5,
                            what=f"{victim} DOWN")
        print(f"slurmd killed -> {victim} DOWN {time.monotonic() - t0:.1f}s")
        assert down.not_responding and down.reason == "Not responding"
        requeued = cli.wait_for(lambda: (j := cli.job(job_id)) and j.restarts > job.restarts and j, 20,
                                what=f"job {job_id} requeued")
        # A requeued job counts its restart while the old allocation is still
        # COMPLETING (its epilog), then comes back PENDING or RUNNING.
        back = {JobState.PENDING, JobState.REQUEUED, JobState.RUNNING}
        if requeued.state not in back:
            assert requeued.state is JobState.COMPLETING, requeued
            requeued = cli.wait_for(lambda: (j := cli.job(job_id)) and j.state in back and j, 30, interval_s=0.5,
                                    what=f"job {job_id} back after its requeue")
        assert requeued.restarts > job.restarts
    finally:
        local_slurm("restart-node", victim)
    cli.wait_for(lambda: (n := cli.node(victim)) and n.usable, 30, interval_s=0.2, what=f"{victim} back")
    cli.cancel(job_id)
