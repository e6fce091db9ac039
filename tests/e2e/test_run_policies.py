"""Faults end to end: real processes under `trainwarden run`, judged by the
shipped rules, recorded in the history."""

import pytest

from tests.e2e.helpers import actions, run_behave

pytestmark = pytest.mark.e2e

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
USER = "ModuleNotFoundError: No module named 'transformerz'"


def test_a_retryable_crash_restarts_a_sync_job_which_then_succeeds(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True",
                        "--fail-rank", "1", "--fail-rounds", "0", "--fail-message", NCCL)
    assert result.code == 0, result
    assert "[worker-1] hello worker-1 rank=1 round=1 start=1" in result.out
    [record] = [r for r in history(job_id) if r["result"] == "done"]
    assert record["action"] == "restart_job" and record["error_source"] == "instance_exit"
    assert record["instance_name"] == "worker-1" and record["error_code"] == 1 and record["round"] == 0
    assert "NCCL error" in record["error_message"] and record["duration_s"] > 0


def test_a_user_error_fails_the_job_under_exit_code_and_error_msg(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True", "--fail-rank", "0", "--fail-message", USER)
    assert result.code == 1, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "fail_job" and record["reason"] == "non_retryable_failure"
    assert record["category"] == "user_missing_module"


def test_on_failure_restarts_even_a_user_error(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --fault-tolerant-policy=OnFailure",
                        "--fail-rank", "0", "--fail-rounds", "0", "--fail-message", USER)
    assert result.code == 0, result
    assert [r["action"] for r in history(job_id) if r["result"] == "done"] == ["restart_job"]


def test_the_never_policy_fails_the_job_even_on_a_retryable_error(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --fault-tolerant-policy=Never",
                        "--fail-rank", "0", "--fail-rounds", "0", "--fail-message", NCCL)
    assert result.code == 1, result
    assert [r["reason"] for r in history(job_id, "--wide") if r["result"] == "done"] == ["policy_never"]


def test_restarts_disabled_turn_a_retryable_fault_into_a_failed_job(cli, job_id, history):
    result = run_behave(cli, job_id, "", "--fail-rank", "1", "--fail-message", NCCL)
    assert result.code == 1, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "fail_job" and record["reason"] == "restarts_disabled"


def test_a_job_that_keeps_crashing_fails_after_the_restart_limit(cli, job_id, history):
    # The same kill at step 0 every round: with the no-progress guards on it would end at its second
    # time (engine/operational.py); off, the restart limit ends it.
    result = run_behave(cli, job_id, "--enable-job-restart=True --max-num-of-job-restart=2 "
                        "--max-num-of-no-progress-restart=-1",
                        "--fail-rank", "0", "--fail-code", "137", "--fail-at-step", "0")
    assert result.code == 1, result
    done = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert [(r["action"], r["round"]) for r in done] == [("restart_job", 0), ("restart_job", 1), ("fail_job", 2)]
    assert done[-1]["reason"] == "restart_limit_reached"


def test_a_custom_keyword_from_the_sdk_makes_a_user_error_retryable(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True", "--keyword", "error_yyy",
                        "--fail-rank", "1", "--fail-rounds", "0", "--fail-message", "ValueError: error_yyy in shard 7")
    assert result.code == 0, result
    assert "keywords OK" in result.out
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "restart_job" and record["category"] == "custom_keyword"


def test_a_custom_message_is_recorded_as_a_notification(cli, job_id, history):
    result = run_behave(cli, job_id, "", "--message", "The training loss of the job is NaN.", nproc=1)
    assert result.code == 0, result
    [record] = history(job_id)
    assert (record["action"], record["error_source"], record["result"]) == ("notify", "sdk", "done")
    assert record["error_message"] == "The training loss of the job is NaN."


def test_async_restarts_only_the_failed_worker_and_the_others_keep_their_pids(cli, job_id, history):
    from tests.e2e.helpers import pids_by_instance

    result = run_behave(cli, job_id, "--job-execution-mode=Async --fault-tolerant-policy=OnFailure",
                        "--fail-rank", "2", "--fail-starts", "0", "--fail-at-step", "2",
                        "--steps", "12", "--step-s", "0.1", nproc=3)
    assert result.code == 0, result
    pids = pids_by_instance(result.out)
    assert len(pids["worker-0"]) == 1 and len(pids["worker-1"]) == 1, pids
    assert len(pids["worker-2"]) == 2, pids
    assert "hello worker-2 rank=2 round=0 start=1" in result.out
    [record] = [r for r in history(job_id) if r["result"] == "done"]
    assert record["action"] == "restart_instance" and record["instance_name"] == "worker-2"


def test_more_failed_workers_than_tolerated_fail_an_async_job(cli, job_id, history):
    result = run_behave(cli, job_id, "--job-execution-mode=Async --fault-tolerant-policy=OnFailure "
                        "--max-tolerated-failure-rate=0.25",
                        "--fail-rank", "0,1", "--fail-starts", "0", "--steps", "40", "--step-s", "0.1",
                        "--fail-at-step", "1", nproc=4)
    assert result.code == 1, result
    done = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    # Both workers die within a millisecond or so: the order is not fixed.
    assert sorted(r["action"] for r in done) == ["fail_job", "restart_instance"]
    assert [r["reason"] for r in done if r["action"] == "fail_job"] == ["failure_rate_exceeded"]


def test_the_same_error_more_often_than_allowed_fails_the_job(cli, job_id, history):
    result = run_behave(cli, job_id, "--job-execution-mode=Async --fault-tolerant-policy=OnFailure "
                        "--max-num-of-same-error=2 --max-num-of-job-restart=10",
                        "--fail-rank", "0", "--fail-at-step", "0", "--fail-message", NCCL,
                        "--steps", "60", "--step-s", "0.1", nproc=2)
    assert result.code == 1, result
    done = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert [r["action"] for r in done] == ["restart_instance", "restart_instance", "fail_job"]
    assert done[-1]["reason"] == "same_error_limit_reached"


def _tf_job(tmp_path, job_id: str, args: str, *behave: str):
    import json
    import sys

    from tests.e2e.helpers import BEHAVE

    command = json.dumps([sys.executable, BEHAVE, "--serve-role", "ps", "--steps", "6", "--step-s", "0.1", *behave])
    path = tmp_path / "tf-job.yaml"
    path.write_text(f"""
job_id: {job_id}
framework: tensorflow
args: "{args}"
stop_grace_s: 1
roles:
  chief: {{count: 1, command: {command}}}
  ps: {{count: 1, command: {command}}}
  worker: {{count: 2, command: {command}}}
""")
    return path


def test_a_failed_parameter_server_fails_an_async_job_without_enable_job_restart(cli, job_id, history, tmp_path):
    job = _tf_job(tmp_path, job_id, "--job-execution-mode=Async --fault-tolerant-policy=OnFailure",
                  "--fail-role", "ps", "--fail-code", "137")
    result = cli("run", str(job))
    assert result.code == 1, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert (record["action"], record["reason"], record["instance_name"]) == ("fail_job", "restarts_disabled", "ps-0")


def test_a_failed_chief_restarts_an_async_job_with_enable_job_restart(cli, job_id, history, tmp_path):
    job = _tf_job(tmp_path, job_id,
                  "--job-execution-mode=Async --fault-tolerant-policy=OnFailure --enable-job-restart=True",
                  "--fail-role", "chief", "--fail-rounds", "0")
    result = cli("run", str(job))
    assert result.code == 0, result  # the ps serves until the chief and workers are done, then is stopped
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert (record["action"], record["reason"], record["instance_name"]) == (
        "restart_job", "critical_role_failed", "chief-0")
