"""The no-progress guard's edges that a timeline cannot state (rules/tests/progress.yaml has the rest)."""

from tests.builders import Job
from trainwarden.events import DecisionKind, Reason, SdkOp
from trainwarden.sdk.protocol import MAX_STEP

GUARD_OF_ONE = "--enable-job-restart=True --max-num-of-job-restart=20 --max-num-of-no-progress-restart=1"


def test_a_step_from_the_bus_out_of_the_sdks_range_is_ignored_and_cannot_block_later_progress():
    job = Job(GUARD_OF_ONE)
    job.at(1).sdk("worker-0", SdkOp.REPORT_PROGRESS, step=MAX_STEP + 1)  # forged past any real step
    job.at(2).sdk("worker-0", SdkOp.REPORT_PROGRESS, step=-7)
    assert job.state.best_step == -1
    job.at(3).sdk("worker-0", SdkOp.REPORT_PROGRESS, step=10)
    [first] = job.at(4).exit("worker-1", 137)
    job.restart_all()
    job.at(5).sdk("worker-0", SdkOp.REPORT_PROGRESS, step=20)
    [second] = job.at(6).exit("worker-1", 137)
    assert first.kind is second.kind is DecisionKind.RESTART_JOB
    assert job.state.no_progress_restarts == 0


def test_a_step_reported_by_a_stopped_incarnation_does_not_count_for_the_next_round():
    job = Job(GUARD_OF_ONE)
    job.at(1).sdk("worker-0", SdkOp.REPORT_PROGRESS, step=10)
    [restart] = job.at(2).exit("worker-1", 137)
    # worker-0 of round 0 saves once more while it is being stopped: stale, not the new round's progress.
    from trainwarden.events import SdkMessage
    job.feed(SdkMessage(job_id="job-1", time=job.now, instance="worker-0", round=0, start=0,
                        op=SdkOp.REPORT_PROGRESS, step=11))
    job.restart_all()
    # Other errors each time: the same one again without progress is judged sooner (engine/operational.py).
    [second] = job.at(3).exit("worker-1", 1, "OSError: [Errno 116] Stale file handle")
    job.restart_all()
    [third] = job.at(4).exit("worker-1", 137)
    assert [d.kind for d in (restart, second)] == [DecisionKind.RESTART_JOB] * 2
    assert third.kind is DecisionKind.FAIL_JOB and third.reason is Reason.NO_PROGRESS
