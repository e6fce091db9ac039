"""``trainwarden run --run-as USER``: the job's processes run as that user
(a fresh start and a warm standby alike), still reach the SDK endpoint and
are attributed to their incarnation, and still die with a SIGKILLed run."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import ROOT, TRAINWARDEN, job_processes
from tests.e2e.test_nothing_left_behind import LEFT_WITHIN_S, TREE, TREE_PROCESSES
from tests.other_user import OTHER_UID, other_python, other_writable, python_path

SDK_JOB = """
import os, sys
from trainwarden.sdk import job_monitor as jm
status = jm.Monitor().report_progress(7)
standby = "standby.py" in open("/proc/self/cmdline").read()
print("uid", os.getuid(), "gid", os.getgid(), "groups", os.getgroups(), "sdk", status.to_string(), "standby", standby)
"""


@pytest.fixture
def shared():
    """A directory the job's user can read (pytest's temporary tree is the tests' user's only)."""
    path = other_writable()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _env(tmp_path) -> dict:
    return dict(os.environ, TRAINWARDEN_STORE=str(tmp_path / "store"), PYTHONPATH=python_path())


@pytest.mark.parametrize("preload", [False, True], ids=["fresh", "standby"])
def test_a_job_run_as_another_user_runs_as_it_and_its_sdk_calls_are_still_its_own(tmp_path, shared, job_id, preload):
    python = other_python()
    program = shared / "sdk_job.py"
    program.write_text(SDK_JOB)
    program.chmod(0o644)
    done = subprocess.run([*TRAINWARDEN, "run", "--job-id", job_id, "--run-as", str(OTHER_UID), "--nproc", "2",
                           *(["--preload", "json"] if preload else []), "--", python, str(program)],
                          env=_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if " uid " in line]
    assert len(said) == 2, done.stdout
    for line in said:
        assert f"uid {OTHER_UID} gid {OTHER_UID} groups [] sdk OK: taken standby {preload}" in line, line


def test_a_sigkilled_run_leaves_no_process_of_a_job_run_as_another_user(tmp_path, shared, job_id):
    python = other_python()
    program = shared / "tree.py"
    program.write_text(TREE.replace("sys.executable", repr(python)))
    program.chmod(0o644)
    output = tmp_path / "run.log"
    with open(output, "wb") as log:
        run = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--run-as", "nobody", "--nproc", "1", "--",
                                "sh", "-c", f"{python} {program} 1"],
                               env=_env(tmp_path), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while len(job_processes(job_id)) < TREE_PROCESSES:
            assert run.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.1)
        owners = {_uid_of(pid) for pid, _ in job_processes(job_id)}
        assert owners == {OTHER_UID}, owners
        run.kill()
        run.wait(10)
        deadline = time.monotonic() + LEFT_WITHIN_S
        while job_processes(job_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job_processes(job_id) == []
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def _uid_of(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status").read().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except OSError:
        pass
    return -1


@pytest.mark.parametrize("user, message", [
    ("no-such-user-here", "--run-as: there is no user named 'no-such-user-here' on this machine"),
    ("0", "--run-as root would give the jobs the supervisor's own power"),
])
def test_a_run_as_user_that_cannot_be_is_refused_before_anything_starts(tmp_path, user, message):
    if os.geteuid() != 0 and user == "0":
        message = "--run-as root"
    done = subprocess.run([*TRAINWARDEN, "run", "--run-as", user, "--", "true"], env=_env(tmp_path), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "store").exists()


def test_a_hung_job_run_as_another_user_still_gets_its_stack_report(tmp_path, job_id):
    from trainwarden.diagnose.collect import find_tool

    if not (find_tool("py-spy") or find_tool("pystack")):
        pytest.skip("no stack tool here (pip install trainwarden[diagnose])")
    python = other_python()
    done = subprocess.run([*TRAINWARDEN, "run", "--job-id", job_id, "--run-as", str(OTHER_UID), "-o", "json",
                           "--quiet", "--args", "--enable-job-restart=True --enable-job-hang-detection=True "
                           "--job-hang-interval=3", "--", python, str(ROOT / "tests" / "e2e" / "programs" / "behave.py"),
                           "--steps", "3", "--hang-rank", "0", "--hang-rounds", "0", "--hang-at-step", "1"],
                          env=_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    reports = [event["text"] for event in map(json.loads, done.stdout.splitlines())
               if event["event"] == "info" and event["text"].startswith("stack report")]
    assert reports and "1 processes dumped" in reports[0] and "behave.py" in reports[0], reports
