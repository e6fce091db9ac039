"""A worker stopping on SIGTERM inside @hang_detect exits as soon as its
handler returns: its SDK call on the way out does not wait for the engine,
which is busy stopping it (issue 12)."""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROGRAM = str(Path(__file__).resolve().parent / "programs" / "sigterm_scope.py")


def test_a_worker_leaving_a_hang_detect_scope_on_sigterm_is_stopped_in_under_a_second(cli, job_id, history):
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True",
                 "--stop-grace", "10", "--", sys.executable, PROGRAM)
    assert result.code == 0, result
    assert "checkpoint saved" in result.out and "rank 0 done" in result.out
    [stages] = history(job_id, "--stages")
    stopping = stages["stopped_at"] - stages["decided_at"]
    # Without the fix the SDK call blocks until the 10 s grace ends in SIGKILL.
    assert 0 <= stopping < 1.0, stages
