"""A scheduler's preemption in the pure engine: not a fault, said once per
round, and carried on the bus like any event."""

from __future__ import annotations

from trainwarden.bus.serde import decode, encode
from trainwarden.bus.base import EVENTS
from trainwarden.events import DecisionKind, ErrorSource, Preempted, Reason
from tests.builders import Job
from tests.engine.test_spot import SpotJob, offer

WHY = "Slurm requeued allocation 7 (restart 1) while its nodes were up"


def _preempted(job, round_=None):
    return job.feed(Preempted(job_id=job.job_id, time=job.now, reason=WHY,
                              round=job.state.round if round_ is None else round_))


def test_a_notice_about_a_round_that_is_over_changes_nothing():
    job = Job("--enable-job-restart=True")
    [restart] = job.at(1).exit("worker-0", 137)
    assert restart.kind is DecisionKind.RESTART_JOB and job.state.round == 1
    assert _preempted(job.at(2), round_=0) == []
    assert job.state.round == 1


def test_preemptions_never_use_up_the_restarts_of_failures():
    job = Job("--enable-job-restart=True --max-num-of-job-restart=1")
    for second in (1, 2, 3):
        [decision] = _preempted(job.at(second))
        job.restart_all()
        assert (decision.kind, decision.reason, decision.error_source) == (
            DecisionKind.RESTART_JOB, Reason.PREEMPTED, ErrorSource.PREEMPTION)
    assert job.state.round == 3 and job.state.job_restarts == 0
    [restart] = job.at(4).exit("worker-1", 137)
    assert restart.kind is DecisionKind.RESTART_JOB and restart.reason is Reason.RETRYABLE_FAILURE


def test_sigterm_deaths_held_for_the_notice_are_covered_by_it():
    job = Job("--enable-job-restart=False")
    assert job.at(1).exit("worker-0", 143) == []
    assert job.exit("worker-1", -15) == []
    assert job.at(3).tick() == []
    [decision] = _preempted(job.at(3))
    assert decision.reason is Reason.PREEMPTED and job.state.pending_failures is None
    assert not job.state.finished


def test_a_preempted_spot_job_goes_back_to_its_bidding_queue():
    job = SpotJob()
    job.at(1).market(offer(0.4))
    [decision] = _preempted(job.at(5))
    assert decision.kind is DecisionKind.REQUEUE and decision.reason is Reason.PREEMPTED
    assert decision.cost is not None and decision.cost.preemptions == 1


def test_a_preempted_notice_survives_the_bus():
    event = Preempted(job_id="job-1", time=12.5, round=3, reason=WHY)
    assert decode(EVENTS, encode(event)) == event
