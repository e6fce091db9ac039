"""The local runtime: environment, output, process groups, usage errors,
and reading the history while a job runs."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TRAINWARDEN, job_processes
from tests.e2e.helpers import BEHAVE, run_behave

pytestmark = pytest.mark.e2e


def _envs(stdout: str) -> list[dict]:
    return [json.loads(line.split("] env ", 1)[1]) for line in stdout.splitlines() if "] env {" in line]


def test_instances_get_torchrun_and_trainwarden_variables_and_the_callers_environment(cli, job_id):
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True",
                 "--stop-grace", "1", "--", sys.executable, BEHAVE, "--env",
                 "--fail-rank", "1", "--fail-rounds", "0", "--fail-code", "137",
                 env={"TRAINWARDEN_CALLER": "kept"})
    assert result.code == 0, result
    envs = _envs(result.out)
    assert len(envs) == 4
    first = [e for e in envs if e["TRAINWARDEN_RESTART_ROUND"] == "0"]
    second = [e for e in envs if e["TRAINWARDEN_RESTART_ROUND"] == "1"]
    assert sorted(e["RANK"] for e in first) == ["0", "1"]
    assert all(e["WORLD_SIZE"] == "2" and e["MASTER_ADDR"] == "127.0.0.1" for e in envs)
    assert all(e["TRAINWARDEN_JOB_ID"] == job_id and e["TRAINWARDEN_CALLER"] == "kept" for e in envs)
    assert {e["TRAINWARDEN_INSTANCE"] for e in first} == {"worker-0", "worker-1"}
    assert all(e["TRAINWARDEN_INSTANCE_RESTARTS"] == "1" and e["TORCHELASTIC_RESTART_COUNT"] == "1"
               for e in second)
    # A free port per round.
    assert len({e["MASTER_PORT"] for e in first}) == 1 and first[0]["MASTER_PORT"] != second[0]["MASTER_PORT"]


def test_output_is_echoed_with_the_instance_prefix_and_split_on_carriage_returns(cli, job_id):
    code = "import sys; sys.stdout.write('10%\\r20%\\rdone\\n'); sys.stderr.write('warn\\n')"
    result = cli("run", "--job-id", job_id, "--", sys.executable, "-c", code)
    assert result.code == 0, result
    assert "[worker-0] 10%\n[worker-0] 20%\n[worker-0] done" in result.out
    assert "[worker-0] warn" in result.err


def test_huge_and_non_utf8_lines_are_bounded_and_kept(cli, job_id):
    code = ("import sys; sys.stdout.buffer.write(b'x' * 100000 + b'\\n' + b'bad \\xff\\xfe bytes\\n'); "
            "sys.stdout.flush(); sys.exit(3)")
    result = cli("run", "--job-id", job_id, "--", sys.executable, "-c", code)
    assert result.code == 1, result
    assert "…[line truncated]" in result.out and "bad \ufffd\ufffd bytes" in result.out
    assert max(len(line) for line in result.out.splitlines()) < 20000


def test_a_crashed_instances_data_loader_children_do_not_survive(cli, job_id):
    result = run_behave(cli, job_id, "--enable-job-restart=True --max-num-of-job-restart=1",
                        "--child", "--fail-rank", "0", "--fail-code", "137")
    assert result.code == 1, result
    # The autouse fixture also checks; asserting here names the cause.
    time.sleep(0.5)
    assert job_processes(job_id) == []


def test_sigterm_to_trainwarden_stops_every_instance_and_records_the_job(store, job_id, cli):
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"))
    proc = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--stop-grace", "1", "--",
                             sys.executable, BEHAVE, "--child", "--steps", "1000", "--step-s", "0.1"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while len(job_processes(job_id)) < 4 and time.time() < deadline:
        time.sleep(0.1)
    assert len(job_processes(job_id)) >= 4
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert job_processes(job_id) == []
    jobs = json.loads(cli("history", "--jobs", "--job", job_id, "--json").out)
    assert jobs[0]["status"] == "cancelled"


def test_the_history_can_be_read_while_the_job_is_running(store, job_id, cli):
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"))
    proc = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--stop-grace", "1",
                             "--args", "--enable-job-restart=True", "--", sys.executable, BEHAVE,
                             "--fail-rank", "1", "--fail-rounds", "0", "--fail-code", "137",
                             "--steps", "100", "--step-s", "0.1"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        records = []
        while time.time() < deadline:
            result = cli("history", "--job", job_id, "--json")
            if result.code == 2 and ("does not exist" in result.err or "has no job" in result.err):
                time.sleep(0.3)  # the run has not written its first record yet
                continue
            assert result.code == 0, result
            records = [r for r in json.loads(result.out) if r["result"] == "done"]
            if records:
                break
            time.sleep(0.3)
        assert proc.poll() is None, "the job should still be running"
        assert records and records[0]["action"] == "restart_job"
        jobs = json.loads(cli("history", "--jobs", "--job", job_id, "--json").out)
        assert jobs[0]["status"] == "running"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("args, flag", [
    ("--job-hang-interval=0", "job-hang-interval"),
    ("--enable-job-restart=maybe", "enable-job-restart"),
    ("--max-tolerated-failure-rate=2", "max-tolerated-failure-rate"),
    ("--no-such-flag=1", "no-such-flag"),
])
def test_a_bad_flag_is_a_usage_error_that_names_it(cli, job_id, args, flag):
    result = cli("run", "--job-id", job_id, "--args", args, "--", sys.executable, "-c", "print(1)")
    assert result.code == 2, result
    assert flag in result.err and "Traceback" not in result.err
    assert "[worker-0]" not in result.out  # nothing was started


def test_a_bad_job_file_is_a_usage_error_naming_its_line(cli, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("framework: pytorch\nroles:\n  worker:\n    count: 2\n    comand: [python, x.py]\n")
    result = cli("run", str(job))
    assert result.code == 2, result
    assert f"{job}:5" in result.err and "comand" in result.err


def test_a_command_that_cannot_start_fails_like_a_shell_would_with_127(cli, job_id, history):
    result = cli("run", "--job-id", job_id, "--", "/nonexistent/train")
    assert result.code == 1 and "Traceback" not in result.err, result
    [record] = [r for r in history(job_id) if r["result"] == "done"]
    assert record["error_code"] == 127 and "cannot start" in record["error_message"]


def test_an_unusable_store_is_a_clear_error_before_anything_starts(cli, job_id):
    result = cli("run", "--job-id", job_id, "--store", "/proc/no/store", "--", sys.executable, "-c", "print(1)")
    assert result.code == 1 and "/proc/no/store" in result.err and "hint:" in result.err
    assert "Traceback" not in result.err
    assert "[worker-0]" not in result.out
