"""The root cause decides a Sync job's failure, not the first exit (issue 11):
real processes, a persistent error on one rank with slow exit handlers, and
its peers' aftermath."""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROGRAM = str(Path(__file__).resolve().parent / "programs" / "peer_closed.py")
ARGS = "--enable-job-restart=True --max-num-of-job-restart=3"


def _failure(history, job_id):
    records = history(job_id, "--wide")
    assert [r["action"] for r in records].count("restart_job") == 0, records
    [failed] = [r for r in records if r["action"] == "fail_job"]
    return failed


def test_a_persistent_error_with_slow_exit_handlers_fails_the_job_despite_its_peers_closed_connections(
        cli, job_id, history):
    result = cli("run", "--job-id", job_id, "--nproc", "3", "--args", ARGS, "--stop-grace", "1",
                 "--", sys.executable, PROGRAM)
    assert result.code == 1, result
    # The survivors exited first, 2 s before the failing rank.
    assert "Connection closed by peer" in result.err and "shapes cannot be multiplied" in result.err
    failed = _failure(history, job_id)
    assert failed["instance_name"] == "worker-1" and failed["reason"] == "non_retryable_failure"
    assert "mat1 and mat2 shapes cannot be multiplied" in failed["error_message"]
    assert failed["category"] == "user_shape_error" and failed["verdict"] == "not_retryable"
    # Consequences in the order their instances failed, which the two survivors race for.
    assert sorted(failed["consequences"].split("; ")) == ["worker-0: connection_lost", "worker-2: connection_lost"]
    # The operational evidence weighed beside the verdict (engine/operational.py): a first error before any progress.
    assert failed["evidence"].startswith("phase: ") and "no progress in its round" in failed["evidence"]
    assert "recurrence: first time in this job" in failed["evidence"] and "node: " in failed["evidence"]


def test_the_same_verdict_comes_from_one_tail_holding_every_rank_and_torchruns_summary(cli, job_id, history):
    result = cli("run", "--job-id", job_id, "--nproc", "1", "--args", ARGS, "--stop-grace", "1",
                 "--", sys.executable, PROGRAM, "--launcher")
    assert result.code == 1, result
    # torchrun's "root cause" is the first exit it saw: a survivor's.
    assert "Root Cause (first observed failure)" in result.out
    failed = _failure(history, job_id)
    assert failed["instance_name"] == "worker-0" and failed["reason"] == "non_retryable_failure"
    assert failed["error_message"].startswith("rank 1: ") and "shapes cannot be multiplied" in failed["error_message"]
    assert failed["category"] == "user_shape_error" and failed["verdict"] == "not_retryable"
    assert "worker-0 rank 0: connection_lost" in failed["consequences"]
