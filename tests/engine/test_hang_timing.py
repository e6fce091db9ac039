"""Hang detection timing with a pinned clock: never before the interval,
and at the first tick at or after it."""

import pytest

from trainwarden.engine import next_deadline
from trainwarden.events import DecisionKind, Reason, SdkOp
from tests.builders import T0, Job

HANG = "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=60"


def _spoken(args: str = HANG) -> Job:
    """A job whose instances printed their first line at T0 (past the start-up allowance)."""
    job = Job(args)
    job.at(0).log("worker-0")
    job.at(0).log("worker-1")
    return job


def test_silence_a_millisecond_short_of_the_interval_is_not_a_hang():
    job = _spoken()
    assert job.at(59.999).tick() == []


def test_silence_of_exactly_the_interval_is_a_hang():
    job = _spoken()
    [decision] = job.at(60).tick()
    assert decision.kind is DecisionKind.RESTART_JOB and decision.reason is Reason.JOB_HANG
    assert decision.detected_at == T0 + 60


def test_before_its_first_line_an_instance_gets_the_start_up_allowance_not_the_interval():
    job = Job(HANG)
    job.at(0).log("worker-0")
    assert job.at(299.9).tick() == []  # worker-1 is still importing torch
    [decision] = job.at(300).tick()
    assert decision.reason is Reason.JOB_HANG and "never printed a line" in decision.error_message
    assert "worker-1" in decision.error_message


@pytest.mark.parametrize("tick_s", [1.0, 0.5, 0.2])
def test_with_ticks_every_t_seconds_detection_comes_at_most_t_after_the_interval(tick_s):
    job = Job(HANG)
    job.at(7.3).log("worker-0")
    job.at(7.3).log("worker-1")
    fired_at = None
    t = 0.0
    while fired_at is None and t < 200:
        t = round(t + tick_s, 6)
        if job.at(t).tick():
            fired_at = t
    assert 7.3 + 60 <= fired_at <= 7.3 + 60 + tick_s


def test_the_hang_deadline_is_the_latest_silence_end_over_running_instances():
    job = Job(HANG)
    job.at(10).log("worker-0")
    job.at(25).log("worker-1")
    assert next_deadline(job.state) == T0 + 85


def test_silence_inside_hang_detect_minus_one_is_not_a_hang():
    job = Job(HANG)
    job.at(1).sdk("worker-0", SdkOp.SET_HANG_INTERVAL, interval=-1)
    job.at(1).sdk("worker-1", SdkOp.SET_HANG_INTERVAL, interval=-1)
    assert job.at(10_000).tick() == []
    assert next_deadline(job.state) is None


def test_a_new_interval_restarts_the_silence_clock():
    job = _spoken()
    job.at(50).sdk("worker-0", SdkOp.SET_HANG_INTERVAL, interval=30)
    assert job.at(60).tick() == []  # worker-0's clock restarted at 50
    assert job.at(79.9).tick() == []
    assert job.at(80).tick()[0].reason is Reason.JOB_HANG


def test_log_lines_do_not_trigger_timers_only_ticks_do():
    job = Job(HANG)
    assert job.at(500).log("worker-0") == []
    assert job.at(500).tick() == []  # worker-0 just spoke


def test_an_instance_being_restarted_keeps_the_job_from_counting_as_hung():
    job = Job("--enable-job-restart=True --job-execution-mode=Sync --enable-job-hang-detection=True "
              "--job-hang-interval=5")
    job.at(1).exit("worker-0", 137)  # restart_job: everyone pending until started again
    assert job.at(100).tick() == []
    job.restart_all()
    job.at(100).log("worker-0")
    job.at(100).log("worker-1")
    assert job.at(104.9).tick() == []
    assert job.at(105).tick()[0].reason is Reason.JOB_HANG
