"""Grouping: at most one message per (subscription, job, type) per interval, with a suppressed count."""

import json

from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason
from trainwarden.notify import events_from_decision
from tests.notify.conftest import subscription_yaml

T0 = 1_764_400_000.0


class Clock:
    def __init__(self, at: float = T0):
        self.now = at

    def __call__(self) -> float:
        return self.now


def restart(i: int, job: str = "flappy", at: float = T0, kind=DecisionKind.RESTART_JOB):
    decision = Decision(kind=kind, reason=Reason.RETRYABLE_FAILURE, rule="r", job_id=job, time=at, round=i,
                        action_id=f"{job}-crash-{i}", error_source=ErrorSource.INSTANCE_EXIT, instance="worker-0",
                        error_code=1, error_message=f"crash {i}")
    [event] = events_from_decision(decision)
    return event


def messages(hook):
    return [json.loads(r.body) for r in hook.requests]


def test_a_job_failing_50_times_in_a_minute_produces_a_bounded_number_of_messages_with_a_suppressed_count(
        receiver, subs_dir, notifier_for):
    hook = receiver()
    clock = Clock()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=20)), clock=clock)
    for i in range(50):
        clock.now = T0 + i * 1.2  # 50 restarts in 58.8 s
        notifier.submit(restart(i, at=clock.now))
        notifier.run_once()
    clock.now = T0 + 120
    notifier.run_once()
    sent = messages(hook)
    assert 2 <= len(sent) <= 4, [m["data"]["suppressed_count"] for m in sent]  # one per 20 s window
    # Every restart is either a message or counted in exactly one message.
    assert sum(1 + m["data"]["suppressed_count"] for m in sent) == 50
    assert sent[0]["data"]["suppressed_count"] == 0 and sent[-1]["data"]["round"] == 49
    assert all(m["data"]["suppressed_since"] for m in sent[1:])
    times = [r.at for r in hook.requests]
    latest = {r.delivery_id: r for r in notifier.log.records}.values()
    assert sum(r.status == "delivered" for r in latest) == len(sent)
    assert sum(r.status == "suppressed" for r in latest) == 50 - len(sent)
    assert len(times) == len(set(hook.ids()))


def test_the_last_suppressed_event_is_sent_when_its_window_ends_even_if_nothing_follows(
        receiver, subs_dir, notifier_for):
    hook = receiver()
    clock = Clock()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=60)), clock=clock)
    for i in range(3):
        clock.now = T0 + i
        notifier.submit(restart(i, at=clock.now))
        notifier.run_once()
    assert len(hook.requests) == 1
    clock.now = T0 + 59
    notifier.run_once()
    assert len(hook.requests) == 1
    clock.now = T0 + 60
    notifier.run_once()
    last = messages(hook)[-1]["data"]
    assert len(hook.requests) == 2 and last["round"] == 2 and last["suppressed_count"] == 1
    assert last["suppressed_since"] == "2025-11-29T07:06:41.000Z"


def test_other_jobs_and_other_event_types_are_not_limited_together(receiver, subs_dir, notifier_for):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=600)), clock=Clock())
    notifier.submit(restart(0, job="a"))
    notifier.submit(restart(0, job="b"))
    notifier.submit(restart(0, job="a", kind=DecisionKind.RESTART_INSTANCE))
    notifier.submit(restart(1, job="a"))
    for _ in range(4):
        notifier.run_once()
    assert [(m["data"]["job_id"], m["type"]) for m in messages(hook)] == [
        ("a", "job.restarted"), ("b", "job.restarted"), ("a", "instance.restarted")]


def test_the_windows_and_the_held_message_survive_a_restart_of_the_notifier(receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver()
    directory = subs_dir(subscription_yaml("ops", hook.url, rate=60))
    clock = Clock()
    first = notifier_for(directory, clock=clock)
    first.submit(restart(0))
    first.run_once()
    clock.now = T0 + 5
    first.submit(restart(1, at=clock.now))
    first.close()
    clock.now = T0 + 10
    second = notifier_for(directory, clock=clock)
    second.submit(restart(2, at=clock.now))  # still inside the window opened before the restart
    second.run_once()
    assert len(hook.requests) == 1
    clock.now = T0 + 61
    second.run_once()
    sent = messages(hook)
    assert [m["data"]["round"] for m in sent] == [0, 2] and sent[1]["data"]["suppressed_count"] == 1


def test_drain_can_release_held_messages_for_a_run_that_is_about_to_exit(receiver, subs_dir, notifier_for):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=3600)))
    for i in range(3):
        notifier.submit(restart(i))
    assert notifier.drain(0.5) is False  # the held one waits for its window
    assert notifier.drain(5, release_held=True)
    assert [m["data"]["suppressed_count"] for m in messages(hook)] == [0, 1]


def custom(i: int, job: str = "chatty", at: float = T0):
    decision = Decision(kind=DecisionKind.NOTIFY, reason=Reason.CUSTOM_MESSAGE, rule="sdk_custom_message", job_id=job,
                        time=at, round=0, action_id=f"{job}-message-{i}", error_source=ErrorSource.SDK,
                        instance="worker-0", error_message=f"message {i}", category="custom_message")
    [event] = events_from_decision(decision)
    return event


def test_one_job_cannot_flood_a_receiver_even_with_the_per_type_limit_off(receiver, subs_dir, notifier_for):
    hook = receiver()
    clock = Clock()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=0, extra="  job_limit: "
                                                       "{max_messages: 5, interval_s: 60}\n")), clock=clock)
    for i in range(1000):
        clock.now = T0 + i * 0.01
        notifier.submit(custom(i, at=clock.now))
        if i < 3:
            notifier.submit(restart(i, job="chatty", at=clock.now))
        notifier.run_once()
    assert [json.loads(r.body)["type"] for r in hook.requests] == ["custom.message", "job.restarted"] * 2 + [
        "custom.message"]  # the job's five of the window, whatever their types
    assert notifier.stats()["job_suppressed"] == 1000 + 3 - 5
    notifier.submit(restart(0, job="quiet", at=clock.now))  # another job has its own window
    notifier.run_once()
    assert len(hook.requests) == 6
    clock.now = T0 + 61
    notifier.run_once()
    notifier.run_once()
    sent = messages(hook)
    # The window's end sends the latest of each type held, counting the ones it replaced.
    assert len(sent) == 8, [m["type"] for m in sent]
    assert sum(1 + m["data"]["suppressed_count"] for m in sent if m["data"]["job_id"] == "chatty") == 1003
    last = {m["type"]: m["data"] for m in sent[6:]}
    assert last["custom.message"]["message"] == "message 999" and last["job.restarted"]["round"] == 2


def test_the_job_limit_defaults_to_20_messages_a_minute_and_zero_switches_it_off(subs_dir, tmp_path):
    from trainwarden.notify.config import load_subscriptions

    [default] = load_subscriptions(subs_dir(subscription_yaml("a", "https://example.com/hook"))).subscriptions
    assert (default.job_limit.max_messages, default.job_limit.interval_s) == (20, 60.0)
    loaded = load_subscriptions(subs_dir(subscription_yaml("b", "https://example.com/hook", extra="  job_limit: "
                                         "{interval_s: 0}\n"), name="b.yaml")).subscriptions
    assert {s.name: s.job_limit.interval_s for s in loaded} == {"a": 60.0, "b": 0.0}
