"""The durable queue: a restarted (or killed) notifier loses nothing and repeats nothing acknowledged."""

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainwarden.notify import QueueError, read_delivery_log, sample_event
from trainwarden.notify.events import EVENT_TYPES
from tests.notify.conftest import ENV, subscription_yaml

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parent / "programs" / "notifier_main.py"


def ten_events():
    return [sample_event(t) for t in list(EVENT_TYPES)[:10]]


def test_a_restarted_notifier_delivers_what_was_pending_and_nothing_acknowledged_twice(
        receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver()
    directory = subs_dir(subscription_yaml("ops", hook.url))
    first = notifier_for(directory)
    events = ten_events()
    for event in events:
        first.submit(event)
    for _ in range(4):
        first.run_once()
    first.close()
    assert hook.ids() == [e.id for e in events[:4]]
    second = notifier_for(directory)
    assert second.pending() == 6
    for event in events:  # the input replayed after the restart changes nothing
        second.submit(event)
    assert second.drain(5)
    assert hook.ids() == [e.id for e in events]


def test_a_restarted_notifier_resumes_a_retry_with_the_attempts_it_had(receiver, subs_dir, notifier_for):
    hook = receiver([503, 503])
    directory = subs_dir(subscription_yaml("ops", hook.url, retry="{max_attempts: 3, backoff_s: 0.05, "
                                                                  "max_backoff_s: 0.1}"))
    first = notifier_for(directory)
    event = sample_event("job.failed")
    first.submit(event)
    first.run_once()
    first.close()
    second = notifier_for(directory)
    assert second.drain(5)
    assert [(r.status, r.attempts) for r in second.log.records] == [("retrying", 2), ("delivered", 3)]
    assert hook.ids() == [event.id] * 3


@pytest.mark.parametrize("kill_after", [3, 7])
def test_a_notifier_killed_mid_retry_delivers_every_event_and_repeats_none_it_had_acknowledged(
        receiver, subs_dir, tmp_path, kill_after):
    hook = receiver([503, 503, 503], delay=0.1)  # three failures first: the kill may land mid-retry
    directory = subs_dir(subscription_yaml("ops", hook.url, private=True))
    state = tmp_path / "state"
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT / "pipeline")}
    count = 12

    def run(mode):
        return subprocess.Popen([sys.executable, str(PROGRAM), str(directory), str(state), str(count), mode],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = run("forever")
    try:
        assert hook.wait_for(kill_after, timeout=30), first.stderr.read() if first.poll() is not None else ""
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    before_kill = len(hook.requests)
    acknowledged = {r.event_id for r in read_delivery_log(state / "deliveries.jsonl") if r.status == "delivered"}
    second = run("drain")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert len(set(hook.ids())) == count  # nothing lost
    after = collections.Counter(hook.ids()[before_kill:])
    assert not acknowledged & set(after)  # nothing acknowledged sent again
    # Sent again: at most the one attempt in flight when the kill came (receivers dedupe by webhook-id).
    assert len(set(after) & set(hook.ids()[:before_kill])) <= 1, after
    final = {r.event_id: r.status for r in read_delivery_log(state / "deliveries.jsonl")}
    assert set(final.values()) == {"delivered"} and len(final) == count


def test_a_delivery_finished_just_before_a_crash_is_not_sent_again(receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver()
    directory = subs_dir(subscription_yaml("ops", hook.url))
    first = notifier_for(directory)
    event = sample_event("job.failed")
    first.submit(event)
    [entry] = first.queue.entries.values()
    first.close()
    # The crash window: the id is in done.log, the pending file not yet removed.
    with open(tmp_path / "state" / "done.log", "a") as done:
        done.write(entry.delivery_id + "\n")
    second = notifier_for(directory)
    assert second.pending() == 0 and second.drain(1)
    assert hook.requests == []
    assert not list((tmp_path / "state" / "pending").iterdir())


def test_an_unreadable_pending_file_is_set_aside_and_the_others_are_delivered(receiver, subs_dir, notifier_for,
                                                                                tmp_path):
    hook = receiver()
    directory = subs_dir(subscription_yaml("ops", hook.url))
    first = notifier_for(directory)
    events = ten_events()[:3]
    for event in events:
        first.submit(event)
    first.close()
    damaged = sorted((tmp_path / "state" / "pending").iterdir())[1]
    damaged.write_bytes(b'{"seq": 2, "deliv')
    second = notifier_for(directory)
    assert second.drain(5)
    assert hook.ids() == [events[0].id, events[2].id]
    assert (tmp_path / "state" / "dead" / f"corrupt-{damaged.name}").exists()


def test_a_second_notifier_on_the_same_directory_is_refused(subs_dir, notifier_for, receiver):
    directory = subs_dir(subscription_yaml("ops", receiver().url))
    notifier_for(directory)
    with pytest.raises(QueueError, match="in use by another notifier"):
        notifier_for(directory)


def test_submit_is_durable_when_it_returns_and_takes_milliseconds(subs_dir, notifier_for, receiver, tmp_path):
    notifier = notifier_for(subs_dir(subscription_yaml("ops", receiver().url)))
    events = [sample_event("job.failed", job_id=f"j{i}") for i in range(50)]
    started = time.perf_counter()
    for event in events:
        notifier.submit(event)
    per_event_ms = (time.perf_counter() - started) * 1000 / len(events)
    assert len(list((tmp_path / "state" / "pending").glob("*.json"))) == 50
    assert per_event_ms < 50, per_event_ms
