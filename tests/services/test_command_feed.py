"""An agent's commands are read on a thread of their own, in lockstep with
its loop: a batch is committed only once the loop carried it out, and a bus
error stays said until a poll gets through again."""

from __future__ import annotations

import queue
import threading

from trainwarden.bus import BusError
from trainwarden.services.command_feed import CommandBatch, CommandFeed


class ScriptedConsumer:
    """Polls answer from a script (records, an error, or nothing); every call is logged."""

    def __init__(self, script, positions=None):
        self.script = list(script)
        self.at = dict(positions or {})  # what positions() answers
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.polled = threading.Event()

    def ready(self) -> bool:
        return True

    def positions(self) -> dict:
        return dict(self.at)

    def poll(self, timeout_s, max_records=100):
        with self.lock:
            self.calls.append("poll")
            step = self.script.pop(0) if self.script else []
        self.polled.set()
        if isinstance(step, Exception):
            raise step
        if not step:
            threading.Event().wait(min(timeout_s, 0.01))
        return step

    def commit(self) -> None:
        with self.lock:
            self.calls.append("commit")


def _wait(predicate, timeout_s: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


def test_a_batch_is_committed_only_after_the_loop_says_it_was_handled():
    consumer = ScriptedConsumer([["c1", "c2"]])
    delivered: queue.Queue[CommandBatch] = queue.Queue()
    feed = CommandFeed(consumer, delivered.put, on_ready=lambda: {"joined": 1})
    try:
        batch = delivered.get(timeout=5)
        assert batch.records == ["c1", "c2"]
        threading.Event().wait(0.3)  # the feed waits on the loop meanwhile
        assert "commit" not in consumer.calls and consumer.calls.count("poll") == 1
        batch.handled()
        _wait(lambda: "commit" in consumer.calls)
        assert consumer.calls[:2] == ["poll", "commit"]
        assert feed.is_ready and feed.joined == {"joined": 1}
    finally:
        feed.close()


def test_a_batch_left_unhandled_when_the_feed_closes_is_not_committed():
    consumer = ScriptedConsumer([["c1"]])
    delivered: queue.Queue[CommandBatch] = queue.Queue()
    feed = CommandFeed(consumer, delivered.put, on_ready=dict)
    delivered.get(timeout=5)
    feed.close()
    assert "commit" not in consumer.calls


def test_a_bus_error_is_kept_until_a_poll_gets_through_again():
    consumer = ScriptedConsumer([BusError("Kafka is down."), BusError("Kafka is down."), ["c1"]])
    delivered: queue.Queue[CommandBatch] = queue.Queue()
    feed = CommandFeed(consumer, delivered.put, on_ready=dict)
    try:
        _wait(lambda: feed.error is not None)
        assert "Kafka is down" in str(feed.error)
        batch = delivered.get(timeout=10)  # after two retries
        assert feed.error is None and batch.records == ["c1"]
        batch.handled()
    finally:
        feed.close()


def test_the_feed_is_caught_up_only_once_what_was_read_before_it_joined_is_handled():
    # Joined with the partition's end at 5; the position is 3 until the batch up to 5 is read.
    consumer = ScriptedConsumer([[], ["c3", "c4"]], positions={("commands", 0): 3})
    delivered: queue.Queue[CommandBatch] = queue.Queue()
    feed = CommandFeed(consumer, delivered.put, on_ready=lambda: {("commands", 0): 5})
    try:
        _wait(lambda: feed.is_ready)
        batch = delivered.get(timeout=5)
        consumer.at[("commands", 0)] = 5  # read, not handled yet
        threading.Event().wait(0.2)
        assert not feed.caught_up
        batch.handled()
        _wait(lambda: feed.caught_up)
    finally:
        feed.close()
