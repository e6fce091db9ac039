"""Spot jobs in the pure engine: bidding queue, preemption, requeue, resume, cost."""

from __future__ import annotations

import pytest

from trainwarden.engine import start_job, step
from trainwarden.engine.state import InstanceStatus, SpotPhase
from trainwarden.events import (
    DecisionKind,
    Diagnosis,
    ErrorSource,
    InstanceExited,
    InstanceStarted,
    JobSubmitted,
    MarketUpdate,
    NodeLost,
    Offer,
    Reason,
    SpotBid,
    Tick,
)
from trainwarden.simulation.cluster import instance_specs
from tests.builders import PACK, T0

TYPE = "ecs.g7.xlarge"
FT_ON = "--job-execution-mode=Sync --enable-job-restart=True"


def offer(price: float, stock: int = 8, on_demand: float = 1.2, average: float = 0.0, notice: float = 0.0):
    return Offer(instance_type=TYPE, price=price, stock=stock, on_demand=on_demand, average_price=average,
                 notice_s=notice)


class SpotJob:
    """A two-worker spot job bidding ``discount`` of on-demand (1.2); ``at(s)`` pins the clock."""

    def __init__(self, args: str = FT_ON, discount: float | None = 0.5, price_limit: float | None = None,
                 compare_average: bool = False, count: int = 2):
        self.job_id = "spot-1"
        self.now = T0
        bid = SpotBid(role="worker", instance_type=TYPE, count=count, discount=discount, price_limit=price_limit,
                      compare_average=compare_average)
        self.state, self.decisions = start_job(JobSubmitted(
            job_id=self.job_id, time=T0, framework="pytorch", args=args,
            instances=instance_specs((("worker", count),)), spot=(bid,)), PACK, T0)

    def at(self, seconds: float) -> "SpotJob":
        self.now = T0 + seconds
        return self

    def feed(self, event):
        self.state, decisions = step(self.state, event, self.now)
        self.decisions.extend(decisions)
        return decisions

    def market(self, *offers: Offer):
        decisions = self.feed(MarketUpdate(job_id=self.job_id, time=self.now, offers=offers))
        for d in decisions:
            if d.kind in (DecisionKind.START_JOB, DecisionKind.RESUME_JOB):
                for name, start in d.starts:
                    self.feed(InstanceStarted(job_id=self.job_id, time=self.now, instance=name, round=d.round,
                                              start=start))
        return decisions

    def exit(self, name: str, code: int, round_: int | None = None, start: int | None = None):
        inst = self.state.instances[name]
        return self.feed(InstanceExited(job_id=self.job_id, time=self.now, instance=name, exit_code=code,
                                        round=self.state.round if round_ is None else round_,
                                        start=inst.start if start is None else start))

    def kinds(self):
        return [d.kind for d in self.decisions]


def test_a_spot_job_is_queued_at_submission_and_starts_nothing():
    job = SpotJob()
    assert job.kinds() == [DecisionKind.QUEUE_JOB]
    assert job.decisions[0].reason is Reason.SPOT_QUEUED and job.state.spot.phase is SpotPhase.QUEUED
    assert all(i.status is InstanceStatus.PENDING for i in job.state.instances.values())


def test_a_bid_under_the_price_keeps_the_job_queued_until_the_price_falls_to_the_bid():
    job = SpotJob()
    assert job.at(0).market(offer(0.7)) == []
    assert job.at(30).market(offer(0.61)) == []
    started = job.at(60).market(offer(0.6))  # at the bid (0.5 x 1.2) is enough
    assert [d.kind for d in started] == [DecisionKind.START_JOB]
    assert started[0].reason is Reason.BID_ACCEPTED and started[0].cost.queued_s == 60
    assert job.state.spot.phase is SpotPhase.RUNNING


def test_short_stock_keeps_the_job_queued_even_when_the_bid_is_high_enough():
    job = SpotJob()
    assert job.at(0).market(offer(0.1, stock=1)) == []
    assert [d.kind for d in job.at(5).market(offer(0.1, stock=2))] == [DecisionKind.START_JOB]


def test_a_price_above_the_bid_preempts_the_job_back_into_the_queue_in_a_new_round():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    [requeue] = job.at(100).market(offer(0.9))
    assert requeue.kind is DecisionKind.REQUEUE and requeue.reason is Reason.PREEMPTED
    assert requeue.error_source is ErrorSource.PREEMPTION and "bid 0.6 is below the market price 0.9" in \
        requeue.error_message
    assert job.state.round == 1 and job.state.spot.phase is SpotPhase.QUEUED
    assert job.state.job_restarts == 0 and requeue.cost.preemptions == 1


def test_stock_running_out_preempts_a_running_job():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    [requeue] = job.at(10).market(offer(0.3, stock=1))
    assert requeue.kind is DecisionKind.REQUEUE and "stock" in requeue.error_message


def test_a_requeued_job_resumes_with_new_incarnations_when_the_price_falls_under_its_bid():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    job.at(10).market(offer(0.9))
    [resume] = job.at(20).market(offer(0.4))
    assert resume.kind is DecisionKind.RESUME_JOB and resume.round == 1
    assert dict(resume.starts) == {"worker-0": 1, "worker-1": 1}
    assert all(i.status is InstanceStatus.RUNNING for i in job.state.instances.values())


def test_exits_of_the_killed_incarnation_are_stale_and_judge_nothing():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    job.at(10).market(offer(0.9))
    assert job.at(10.1).exit("worker-0", 137, round_=0, start=0) == []
    assert job.state.stale_events >= 1 and job.state.instances["worker-0"].error_counts == {}


def test_preemptions_never_count_toward_restart_limits_even_with_restarts_off():
    job = SpotJob(args="--enable-job-restart=False --max-num-of-job-restart=0 --max-num-of-same-error=1")
    job.at(0).market(offer(0.3))
    for cycle in range(5):
        job.at(10 + 20 * cycle).market(offer(0.9))
        job.at(20 + 20 * cycle).market(offer(0.3))
    assert job.kinds().count(DecisionKind.REQUEUE) == 5 and job.kinds().count(DecisionKind.RESUME_JOB) == 5
    assert DecisionKind.FAIL_JOB not in job.kinds()
    assert job.state.job_restarts == 0 and job.state.round == 5
    assert all(i.restarts == 0 and i.error_counts == {} for i in job.state.instances.values())


def test_with_fault_tolerance_off_the_job_fails_at_the_first_preemption():
    job = SpotJob(args="--fault-tolerant-policy=Never")
    job.at(0).market(offer(0.3))
    [failed] = job.at(10).market(offer(0.9))
    assert failed.kind is DecisionKind.FAIL_JOB and failed.reason is Reason.PREEMPTED
    assert failed.error_source is ErrorSource.PREEMPTION and job.state.finished
    assert job.at(20).market(offer(0.3)) == []


def test_a_pool_that_releases_on_the_average_price_ignores_a_spike_of_the_market_price():
    job = SpotJob(compare_average=True)
    job.at(0).market(offer(0.3, average=0.4))
    assert job.at(10).market(offer(0.9, average=0.5)) == []
    [requeue] = job.at(20).market(offer(0.9, average=0.7))
    assert "average price 0.7" in requeue.error_message


def test_an_absolute_price_limit_is_the_bid():
    job = SpotJob(discount=None, price_limit=0.25)
    assert job.at(0).market(offer(0.3)) == []
    assert [d.kind for d in job.at(1).market(offer(0.25))] == [DecisionKind.START_JOB]


def test_a_notice_period_of_the_pool_is_carried_on_the_requeue():
    job = SpotJob()
    job.at(0).market(offer(0.3, notice=5))
    [requeue] = job.at(10).market(offer(0.9, notice=5))
    assert requeue.notice_s == 5 and "with 5 s notice" in requeue.error_message


def test_cost_is_the_market_price_times_the_time_held_per_instance_against_on_demand():
    job = SpotJob()
    job.at(0).market(offer(0.7))  # queued for an hour
    job.at(3600).market(offer(0.3))  # 2 instances at 0.3 for an hour
    job.at(7200).market(offer(0.5))  # then at 0.5 for half an hour
    job.at(9000)
    job.exit("worker-0", 0)
    [complete] = job.exit("worker-1", 0)
    assert complete.kind is DecisionKind.COMPLETE_JOB
    cost = complete.cost
    assert cost.paid == pytest.approx(2 * 0.3 + 2 * 0.5 * 0.5)
    assert cost.on_demand == pytest.approx(2 * 1.2 * 1.5)
    assert cost.queued_s == 3600 and cost.held_s == 5400 and cost.preemptions == 0


def test_time_in_the_queue_after_a_preemption_is_not_billed():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    job.at(3600).market(offer(0.9))  # preempted after an hour
    [resume] = job.at(7200).market(offer(0.3))
    assert resume.cost.paid == pytest.approx(0.6) and resume.cost.queued_s == 3600


def test_no_hang_is_detected_while_the_job_waits_in_the_queue():
    job = SpotJob(args=FT_ON + " --enable-job-hang-detection=True --job-hang-interval=60")
    job.at(0).market(offer(0.9))
    assert job.at(10_000).feed(Tick(job_id=job.job_id, time=job.now)) == []


def test_the_same_market_replayed_gives_the_same_action_ids():
    def ids():
        job = SpotJob()
        for second, price in ((0, 0.3), (10, 0.9), (20, 0.3), (30, 0.9)):
            job.at(second).market(offer(price))
        return [d.action_id for d in job.decisions]

    first = ids()
    assert first == ids() and len(set(first)) == len(first)


def test_a_lost_node_or_a_c4d_finding_does_not_restart_a_job_waiting_in_the_queue():
    job = SpotJob(args=FT_ON + " --enable-c4d-hang-detection=True")
    job.at(0).market(offer(0.3))
    job.at(10).market(offer(0.9))
    assert job.feed(NodeLost(job_id=job.job_id, time=job.now, node="n1", instances=("worker-0",))) == []
    assert job.feed(Diagnosis(job_id=job.job_id, time=job.now, node="n1", source="c4d", kind="RankCommHang",
                              level="Error", rank=0)) == []
    assert job.state.job_restarts == 0 and not job.state.finished
