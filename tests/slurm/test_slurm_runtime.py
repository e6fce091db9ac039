"""The ``slurm`` runtime for real: the services as processes on a real Kafka
broker, the agents on the nodes of the local Slurm cluster (n1..n3), jobs
submitted with ``trainwarden submit --runtime slurm`` and run as Slurm
steps. Opt in: TRAINWARDEN_SLURM=1 with SLURM_CONF, and TRAINWARDEN_KAFKA
(.ci/run sets all three)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.cluster.processes import ServiceProcesses, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from tests.scenarios.runtimes import PROGRAM, cancel_slurm_jobs

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
C4D_ERROR = '[C4D] level=Error kind=RankCommHang rank=0 detail="allreduce stuck for 190 s"'
SLURM_SCRIPT = ROOT / "deploy" / "slurm" / "local-slurm"


@pytest.fixture
def slurm():
    if os.environ.get("TRAINWARDEN_SLURM") != "1" or not os.environ.get("SLURM_CONF"):
        pytest.skip("no Slurm cluster: deploy/slurm/local-slurm start, then export the SLURM_CONF it prints and "
                    "TRAINWARDEN_SLURM=1 (.ci/run does)")
    from trainwarden.runtime.slurm.cli import SlurmCli

    return SlurmCli(os.environ["SLURM_CONF"])


@pytest.fixture
def services(slurm, tmp_path, job_id):
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    s = ServiceProcesses(bootstrap, tmp_path, slurm_dir=tmp_path / "slurm")
    yield s
    s.stop()
    cancel_slurm_jobs(job_id)


def _submit(services, job_id, tmp_path, args, *program, nproc=2):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "job_id": job_id, "args": args, "stop_grace_s": 2, "checkpoint_dir": str(tmp_path / "checkpoints"),
        "roles": {"worker": {"count": nproc, "command": [sys.executable, PROGRAM, *program]}}}))
    return services.submit(str(job), "--runtime", "slurm")


def _finish(services, proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    return out


def _node_of(services, job_id, instance, round_):
    for node in services.node_names:
        if any((services.tmp / f"logs-{node}" / job_id / instance).glob(f"r{round_}-*.log")):
            return node
    return None


def _resumed_on(out: str, round_: int) -> dict[str, str]:
    """instance -> the node it resumed on in that round, from the job's own lines."""
    found = {}
    for line in out.splitlines():
        if f"round={round_} " in line and ("resuming" in line or "starting" in line):
            name = line.split("resuming " if "resuming" in line else "starting ", 1)[1].split()[0]
            found[name] = line.rsplit("node=", 1)[1].strip()
    return found


def _done(services, job_id):
    return [r for r in services.history(job_id) if r["result"] == "done"]


def test_a_crash_restarts_the_slurm_job_and_it_resumes_from_its_checkpoint(services, job_id, tmp_path, slurm):
    out = _finish(services, _submit(services, job_id, tmp_path, "--enable-job-restart=True", "--fail-rank", "1",
                                    "--fail-at-step", "2", "--fail-message", NCCL, "--steps", "5"))
    assert "resuming worker-1 round=1 at step 2 resume=1" in out, out
    assert [(r["action"], r["error_source"]) for r in _done(services, job_id)] == [("restart_job", "instance_exit")]
    # History node names are Slurm's.
    nodes = {r["node_name"] for r in services.history(job_id) if r["node_name"]}
    assert nodes <= {"n1", "n2", "n3"}, nodes
    assert set(_resumed_on(out, 1).values()) <= {"n1", "n2", "n3"}


def test_a_c4d_error_drains_the_node_the_next_round_avoids_it_and_uncordon_resumes_it(services, job_id, tmp_path,
                                                                                      slurm):
    proc = _submit(services, job_id, tmp_path, "--enable-job-hang-detection=True --enable-c4d-hang-detection=True "
                   "--enable-job-restart=True", "--steps", "30", "--step-s", "0.25")
    wait_for(lambda: _node_of(services, job_id, "worker-0", 0), 60, "worker-0 running")
    node = _node_of(services, job_id, "worker-0", 0)
    with open(services.tmp / f"c4d-{node}.log", "a") as c4d:
        c4d.write(C4D_ERROR + "\n")
    out = _finish(services, proc)
    assert sorted((r["action"], r["error_source"]) for r in _done(services, job_id)) == [
        ("isolate_node", "c4d"), ("restart_job", "c4d")]
    drained = slurm.node(node)
    assert drained.drain and drained.reason == "Trainwarden: c4d_error", drained
    round1 = _resumed_on(out, 1)
    assert len(round1) == 2 and node not in round1.values(), (node, round1)
    # An operator returns the node: Slurm takes it back.
    subprocess.run([*TRAINWARDEN, "nodes", "uncordon", node], env=services.env, cwd=ROOT, check=True,
                   capture_output=True, timeout=60)
    wait_for(lambda: not slurm.node(node).drain, 30, f"Slurm resuming {node}")


def test_a_node_whose_slurmd_is_killed_is_lost_and_the_job_goes_on_on_the_others(services, job_id, tmp_path, slurm):
    proc = _submit(services, job_id, tmp_path, "--enable-job-restart=True", "--steps", "400", "--step-s", "0.2")
    wait_for(lambda: _node_of(services, job_id, "worker-1", 0), 60, "worker-1 running")
    victim = _node_of(services, job_id, "worker-1", 0)
    # The cluster of SLURM_CONF, not the one of local-slurm's default port base (another session's).
    cluster = {**os.environ, "SLURM_DIR": os.path.dirname(os.environ["SLURM_CONF"])}
    subprocess.run([str(SLURM_SCRIPT), "kill-node", victim], check=True, capture_output=True, timeout=30,
                   env=cluster)
    killed_at = time.time()
    try:
        # Slurm says the node is down after SlurmdTimeout (30 s); the job's next round runs elsewhere.
        wait_for(lambda: _node_of(services, job_id, "worker-0", 1) and _node_of(services, job_id, "worker-1", 1),
                 150, "round 1 running")
        assert time.time() - killed_at < 150
    finally:
        subprocess.run([str(SLURM_SCRIPT), "restart-node", victim], check=False, capture_output=True, timeout=60,
                       env=cluster)
    out = _finish(services, proc, timeout=300)
    round1 = _resumed_on(out, 1)
    assert len(round1) == 2 and victim not in round1.values(), (victim, round1)
    done = _done(services, job_id)
    assert done and done[0]["action"] == "restart_job", done


@pytest.mark.parametrize("args", [
    # Sync, job restarts off: a preemption judged as a failure would fail the job.
    "--enable-job-restart=False",
    # Async, no instance restart allowed: likewise for each instance's SIGTERM death.
    "--job-execution-mode=Async --max-num-of-job-restart=0",
], ids=["sync", "async"])
def test_a_job_preempted_by_a_higher_priority_partition_runs_again_and_no_limit_counts_it(services, job_id, tmp_path,
                                                                                         slurm, args):
    proc = _submit(services, job_id, tmp_path, args, "--steps", "40", "--step-s", "0.25")
    wait_for(lambda: _node_of(services, job_id, "worker-0", 0) and _node_of(services, job_id, "worker-1", 0), 60,
             "round 0 running")
    time.sleep(2)  # a few steps saved
    # A job of the higher-priority partition needs every node: Slurm requeues ours (SIGTERM to its tasks).
    urgent = f"tw-{job_id}-urgent"
    slurm.run(["sbatch", "--parsable", "-p", "urgent", "-N3", "--exclusive", f"--job-name={urgent}",
               "--output=/dev/null", "--wrap", "sleep 4"])
    try:
        out = _finish(services, proc, timeout=300)
    finally:
        slurm.run(["scancel", "--quiet", f"--name={urgent}"])
    assert [(r["action"], r["reason"], r["error_source"]) for r in _done(services, job_id)] == [
        ("restart_job", "preempted", "preemption")], services.history(job_id)
    record = _done(services, job_id)[0]
    assert "while its nodes were up" in record["error_message"], record
    resumed = _resumed_on(out, 1)
    assert len(resumed) == 2, out
    assert "resuming worker-0 round=1 at step" in out, out
