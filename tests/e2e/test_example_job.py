"""The README's example job, exactly as `make example` runs it."""

import re

import pytest

pytestmark = pytest.mark.e2e


def test_the_example_job_recovers_from_a_crash_and_a_hang_and_succeeds(cli, job_id, history, tmp_path):
    result = cli("run", "examples/job.yaml", "--job-id", job_id,
                 env={"CHECKPOINT_DIR": str(tmp_path / "ckpt")}, timeout=180)
    assert result.code == 0, result
    done = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert [(r["action"], r["error_source"]) for r in done] == [
        ("notify", "sdk"), ("restart_job", "instance_exit"), ("restart_job", "hang")]
    assert done[1]["category"] == "collective_error" and done[1]["instance_name"] == "worker-1"
    # Round 2 resumed from a checkpoint instead of starting over.
    assert "round 2: " in result.out and "resuming at step 0" not in result.out.split("round 2")[1]
    # A Sync job's ranks resume together: the same step in every round.
    for round_ in (1, 2):
        steps = set(re.findall(rf"round {round_}: .*, resuming at step (\d+)", result.out))
        assert len(steps) == 1, (round_, result.out)
    # The example runs under python3 from PATH, which imports the SDK through the runtime's path.
    assert "loss is NaN; told the engine: OK" in result.out and "Traceback" not in result.out
    # The workers checkpoint on SIGTERM from inside @hang_detect: each stop
    # ends when they exit, not at the end of the 3 s grace period.
    stages = history(job_id, "--stages")
    assert len(stages) == 2 and all(0 <= s["stopped_at"] - s["decided_at"] < 1.0 for s in stages), stages
