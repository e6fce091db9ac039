"""One clock per decision, on a pinned clock: the engine dates what it learns
by the ``now`` it is given (the deciding process's clock), so an agent whose
clock is ahead or behind neither hides a hang nor makes one; agents' reports
carry silence as a duration; a replay's times are moved onto the live clock."""

import pytest

from tests.builders import PACK, T0, Job
from trainwarden.engine import next_deadline, rebase_times, start_job, step
from trainwarden.engine.timers import REPORT_STALE_S
from trainwarden.events import Activity, DecisionKind, InstanceActivity, InstanceStarted, JobSubmitted, Reason
from trainwarden.simulation.cluster import instance_specs

HANG = "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=5"
EXIT_HANG = "--enable-job-exit-hang-detection=True --job-exit-hang-interval=30"
SKEWS = [-3600.0, -4.0, 0.0, 4.0, 3600.0]
TICK_S = 0.2


def _run(job: Job, until_s: float, print_every_s: float | None, last_line_s: float = 0.0) -> float | None:
    """An agent reporting every second and a tick every 0.2 s; lines every
    ``print_every_s`` (None: silent after ``last_line_s``). When a hang fired."""
    last_line = last_line_s
    t = round(last_line_s, 6)
    while t < until_s:
        t = round(t + TICK_S, 6)
        job.at(t)
        if print_every_s is not None and t - last_line >= print_every_s:
            job.log("worker-0")
            job.log("worker-1")
            last_line = t
        if abs(t - round(t)) < 1e-6:
            silent = round(t - last_line, 6)
            job.activity({"worker-0": silent, "worker-1": silent})
        if job.tick():
            return t
    return None


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_hang_on_an_agent_whose_clock_is_off_is_decided_one_interval_after_the_last_line(skew_s):
    job = Job(HANG, skew_s=skew_s, activity_reports=True)
    job.at(1).log("worker-0")
    job.at(1).log("worker-1")
    fired = _run(job, 60, None, last_line_s=1)
    assert fired is not None and 1 + 5 <= fired <= 1 + 5 + TICK_S, fired
    [decision] = job.decisions
    assert decision.reason is Reason.JOB_HANG and decision.detected_at == T0 + fired


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_healthy_job_on_an_agent_whose_clock_is_off_is_never_declared_hung(skew_s):
    job = Job(HANG, skew_s=skew_s, activity_reports=True)
    assert _run(job, 120, print_every_s=2.0) is None
    assert job.decisions == [] and job.state.silence_checks_skipped == 0


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0])
def test_a_report_dates_the_last_output_by_the_silence_it_carries_on_the_engines_clock(skew_s):
    job = Job(HANG, skew_s=skew_s, activity_reports=True)
    job.at(10).activity({"worker-0": 3.0, "worker-1": 7.5}, spoke=False)
    assert job.state.instances["worker-0"].last_output == T0 + 7
    assert job.state.instances["worker-1"].last_output == T0 + 2.5
    assert next_deadline(job.state) == T0 + 7 + 300  # neither spoke: the start-up allowance, not the interval
    assert job.state.instances["worker-0"].reported_at == T0 + 10


def test_a_report_from_an_older_agent_gives_the_silence_of_its_own_two_times_and_not_that_it_spoke():
    job = Job(HANG, skew_s=-3600.0, activity_reports=True)
    agent_time = job.at(10).time
    old = InstanceActivity(job_id=job.job_id, time=agent_time, node="node-a", instances=(
        Activity("worker-0", 0, 0, last_output=agent_time - 3.0),))  # no silent_s, no spoke
    job.feed(old)
    worker = job.state.instances["worker-0"]
    assert worker.last_output == T0 + 7 and worker.reported_at == T0 + 10
    assert not worker.spoke  # so the start-up allowance stays: a later hang, never an early one


def test_an_agent_saying_an_instance_spoke_ends_its_start_up_allowance():
    job = Job(HANG, activity_reports=True)
    job.at(2).activity({"worker-0": 1.0, "worker-1": 1.0}, spoke=True)
    assert next_deadline(job.state) == T0 + 1 + 5


def test_a_report_claiming_an_absurd_silence_changes_nothing_and_a_negative_one_is_no_silence():
    job = Job(HANG, activity_reports=True)
    job.at(1).log("worker-0")
    job.at(2).activity({"worker-0": 1e308})
    assert job.state.instances["worker-0"].last_output == T0 + 1
    job.at(3).activity({"worker-0": -50.0})
    assert job.state.instances["worker-0"].last_output == T0 + 3


def test_reports_that_stopped_arriving_are_missing_data_not_silence_on_the_engines_clock():
    job = Job(HANG, skew_s=3600.0, activity_reports=True)
    job.at(1).log("worker-0")
    job.at(1).log("worker-1")
    job.at(2).activity({"worker-0": 1.0, "worker-1": 1.0})
    assert job.at(2 + REPORT_STALE_S + 5).tick() == []
    assert job.state.silence_checks_skipped == 1


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0])
def test_the_exit_hang_timer_starts_when_the_exit_arrives(skew_s):
    job = Job(EXIT_HANG, skew_s=skew_s)
    job.at(10).exit("worker-0", 0)
    assert job.at(39.9).tick() == []
    [decision] = job.at(40).tick()
    assert decision.error_source.value == "exit_hang" and "30 s after an instance exited" in decision.error_message


def _replayed(skew_s: float) -> Job:
    """A job rebuilt as a replay does: each event stepped at its sender's time
    (an agent ``skew_s`` off); its last report said: silent for 3 s."""
    job = Job(HANG, activity_reports=True)
    agent = T0 + skew_s
    state, _ = start_job(JobSubmitted(job_id=job.job_id, time=agent, framework="pytorch", args=HANG,
                                      instances=instance_specs((("worker", 2),)), activity_reports=True),
                         PACK, agent)
    for name in state.instances:
        state, _ = step(state, InstanceStarted(job_id=job.job_id, time=agent, instance=name, round=0, start=0),
                        agent)
    for seconds in (2, 3, 4):
        report = InstanceActivity(job_id=job.job_id, time=agent + seconds, node="node-a", instances=tuple(
            Activity(name, 0, 0, agent + 1, silent_s=seconds - 1.0, spoke=True) for name in state.instances))
        state, _ = step(state, report, agent + seconds)
    job.state = state
    return job


@pytest.mark.parametrize("skew_s", [-3600.0, -4.0, 4.0, 3600.0])
def test_after_a_replay_the_timers_keep_the_reported_silence_on_the_live_clock(skew_s):
    job = _replayed(skew_s)
    live = T0 + 100.0  # the new processor's clock when its replay ends
    rebase_times(job.state, live)
    worker = job.state.instances["worker-0"]
    assert (worker.last_output, worker.reported_at) == (live - 3.0, live)
    job.now = live + 1.9
    assert job.tick() == []  # 4.9 s of silence: not yet
    job.now = live + 2.0
    [decision] = job.tick()
    assert decision.kind is DecisionKind.RESTART_JOB and decision.reason is Reason.JOB_HANG


def test_after_a_replay_no_time_lies_in_the_future_and_windows_start_again():
    job = Job(EXIT_HANG, skew_s=3600.0)
    job.now = job.time
    job.exit("worker-0", 0)
    live = T0 + 50.0
    rebase_times(job.state, live)
    assert job.state.first_success_exit == live
    assert all(i.started_at <= live and i.last_output <= live for i in job.state.instances.values())
    job.now = live + 29.9
    assert job.tick() == []


def _silent_from(job: Job, start_s: float, last_said_s: float) -> float | None:
    """Ticks from ``start_s``, the agent reporting every second the silence
    since ``last_said_s`` (its clock), until a hang fires (None within a minute)."""
    t = start_s
    while t < start_s + 60:
        t = round(t + TICK_S, 6)
        if abs(t - round(t)) < 1e-6:
            job.at(t).activity({"worker-0": t - last_said_s, "worker-1": t - last_said_s})
        if job.at(t).tick():
            return t
    return None


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_line_its_agent_had_already_reported_does_not_restart_the_silence(skew_s):
    # A processor that takes a job over may read lines again that its agent's
    # reports already counted: they are old output, not a sign of life.
    job = Job(HANG, skew_s=skew_s, activity_reports=True)
    job.at(1).log("worker-0")
    job.at(1).log("worker-1")
    job.at(3).activity({"worker-0": 2.0, "worker-1": 2.0})
    job.at(4).log("worker-0", said=1.0)
    job.at(4).log("worker-1", said=1.0)
    assert _silent_from(job, 4, last_said_s=1.0) == 1 + 5


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_line_its_agent_read_after_its_last_report_is_output(skew_s):
    job = Job(HANG, skew_s=skew_s, activity_reports=True)
    job.at(3).activity({"worker-0": 2.0, "worker-1": 2.0})
    job.at(4).log("worker-0", said=3.5)
    job.at(4).log("worker-1", said=3.5)
    # Dated by its arrival (4 s), as every line is, not by the agent's clock (3.5 s).
    assert _silent_from(job, 4, last_said_s=3.5) == 4 + 5


def test_a_new_incarnation_forgets_what_the_agent_reported_of_the_one_before():
    job = Job(HANG, activity_reports=True)
    job.at(3).activity({"worker-0": 0.0, "worker-1": 0.0})
    job.at(4).exit("worker-0", 137)  # restart_job: every instance pending until it starts again
    job.restart_all()
    assert [inst.reported_output for inst in job.state.instances.values()] == [None, None]
