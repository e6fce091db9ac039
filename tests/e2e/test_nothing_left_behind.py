"""Nothing a job started outlives the run or the agent that started it, however
that process dies: a SIGKILL runs none of its code, so the runtime's keeper
process must end the job's process tree (a shell, a python it started, a
sleeping python below that; one of them in a session of its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.processes import ServiceProcesses
from tests.conftest import ROOT, TRAINWARDEN, job_processes

# Depth 1 starts depth 2, which leaves the session (as daemons do) and starts
# depth 3; each also starts a shell running sleep. All of them then sleep.
TREE = r'''
import os, subprocess, sys, time
depth = int(sys.argv[1])
if depth == 2:
    os.setsid()
if depth < 3:
    subprocess.Popen([sys.executable, __file__, str(depth + 1)])
    subprocess.Popen(["sh", "-c", "sleep 600; true"])
print(f"depth {depth} pid={os.getpid()}", flush=True)
time.sleep(600)
'''
# A launcher and its worker that both take SIGTERM with a cleanup that takes
# a while; the launcher waits for its worker, as torchrun does.
GRACEFUL = r'''
import os, signal, subprocess, sys, time
done, depth = sys.argv[1], int(sys.argv[2])
worker = subprocess.Popen([sys.executable, __file__, done, "2"]) if depth == 1 else None

def cleanup(signum, frame):
    time.sleep(0.5)
    if worker is not None:
        worker.wait()
    open(os.path.join(done, f"depth-{depth}"), "w").close()
    sys.exit(0)

signal.signal(signal.SIGTERM, cleanup)
open(os.path.join(done, f"ready-{depth}"), "w").close()
while True:
    time.sleep(1)
'''
# sh -c (1) -> depth 1 (2) -> its shell and sleep (4), depth 2 (5) -> its shell and sleep (7), depth 3 (8).
TREE_PROCESSES = 8
LEFT_WITHIN_S = 5.0
READOPT_GRACE_S = 2.0


def _tree_command(tmp_path: Path) -> list[str]:
    program = tmp_path / "tree.py"
    program.write_text(TREE)
    return ["sh", "-c", f"{sys.executable} {program} 1"]


def _wait_for_trees(job_id: str, trees: int, owner: subprocess.Popen, log, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(job_processes(job_id)) < trees * TREE_PROCESSES:
        if owner.poll() is not None:
            pytest.fail(f"the supervising process exited ({owner.returncode}) before the tree started:\n{log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the job's tree did not start: {job_processes(job_id)}\n{log()}")
        time.sleep(0.1)


def _left_after_kill(job_id: str, victim: subprocess.Popen, within_s: float = LEFT_WITHIN_S) -> list:
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    deadline = time.monotonic() + within_s
    left = job_processes(job_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = job_processes(job_id)
    return left


def test_sigkill_of_run_leaves_no_process_of_the_job_at_any_depth_and_the_history_says_it_died(tmp_path, job_id):
    env = dict(os.environ, TRAINWARDEN_STORE=str(tmp_path / "store"), PYTHONPATH=str(ROOT / "pipeline"))
    output = tmp_path / "run.log"
    with open(output, "wb") as log:
        run = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--",
                                *_tree_command(tmp_path)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_trees(job_id, 2, run, output.read_text)
        left = _left_after_kill(job_id, run)
        assert left == [], f"still running {LEFT_WITHIN_S:.0f} s after the run was killed: {left}"
        jobs = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--json"], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert jobs.returncode == 0, jobs.stderr
        assert [(j["job_id"], j["status"], j["reason"]) for j in json.loads(jobs.stdout)] == \
            [(job_id, "failed", "supervisor_died")]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.kafka
def test_sigkill_of_an_agent_leaves_no_process_of_its_job_at_any_depth(tmp_path, job_id, bootstrap):
    # Its instances outlive it for the grace period, for a next run to take them back (none comes here).
    services = ServiceProcesses(bootstrap, tmp_path, nodes=1, agent_args=("--readopt-grace", str(READOPT_GRACE_S)))
    submit = None
    try:
        submit = services.submit("--job-id", job_id, "--nproc", "1", "--", *_tree_command(tmp_path))
        agent = services.procs[f"agent-{services.node_names[0]}"]
        _wait_for_trees(job_id, 1, agent, services.logs)
        left = _left_after_kill(job_id, agent, READOPT_GRACE_S + LEFT_WITHIN_S)
        assert left == [], f"still running {READOPT_GRACE_S + LEFT_WITHIN_S:.0f} s after the agent was killed: {left}"
    finally:
        if submit is not None:
            submit.kill()
            submit.communicate()
        services.stop()


def test_an_orderly_stop_of_run_still_gives_every_process_its_sigterm_grace(tmp_path, job_id):
    program, done = tmp_path / "graceful.py", tmp_path / "files"
    program.write_text(GRACEFUL)
    done.mkdir()
    env = dict(os.environ, TRAINWARDEN_STORE=str(tmp_path / "store"), PYTHONPATH=str(ROOT / "pipeline"))
    output = tmp_path / "run.log"
    with open(output, "wb") as log:
        run = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--stop-grace", "10", "--",
                                sys.executable, str(program), str(done), "1"],
                               env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(list(done.glob("ready-*"))) < 2:  # both have their SIGTERM handler
            assert run.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) != 0
        assert sorted(p.name for p in done.glob("depth-*")) == ["depth-1", "depth-2"], output.read_text()
        assert job_processes(job_id) == []
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
