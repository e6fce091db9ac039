"""A processor whose broker cannot tell it where the market topic ends (no
Read on the topic: the Kafka client retries for its whole request timeout,
30 s, then fails) keeps deciding for every other job; its spot jobs wait for
prices, and take them once the topic can be read."""

from __future__ import annotations

import threading
import time

from tests.spot.test_market_bus import T0, Clock, _bus, _decisions, _publish, _quote, _submit_spot, _turns
from trainwarden.bus import EVENTS, MARKET, BusError
from trainwarden.bus.serde import encode
from trainwarden.events import DecisionKind, JobSubmitted
from trainwarden.rules.loader import load_rules
from trainwarden.services import market_feed
from trainwarden.services.processor import Processor
from trainwarden.simulation.cluster import instance_specs


class UnreadableMarket:
    """A bus whose market end offset answers only once ``readable`` is set:
    until then each lookup waits ``stall_s`` and fails, as a refused Read does."""

    def __init__(self, bus, stall_s: float):
        self.bus = bus
        self.stall_s = stall_s
        self.readable = threading.Event()
        self.lookups = 0

    def __getattr__(self, name):
        return getattr(self.bus, name)

    def consumer(self, topics, group, *args, **kwargs):
        consumer = self.bus.consumer(topics, group, *args, **kwargs)
        if list(topics) != [MARKET]:
            return consumer
        market, original = self, consumer.end_offset

        def end_offset(topic, partition):
            market.lookups += 1
            if not market.readable.wait(market.stall_s):
                raise BusError(f"reading the end offset of {topic}/{partition} failed: TopicAuthorizationFailedError.")
            return original(topic, partition)

        consumer.end_offset = end_offset
        return consumer


def _submit_plain(bus, job_id: str) -> None:
    producer = bus.producer()
    producer.send(EVENTS, job_id, encode(JobSubmitted(job_id=job_id, time=T0, framework="pytorch", args="",
                                                      instances=instance_specs([("worker", 1)]))))
    producer.flush()


def test_a_processor_that_cannot_read_the_market_topic_decides_for_every_other_job_at_once(monkeypatch):
    monkeypatch.setattr(market_feed, "LOOKUP_RETRY_S", 0.05)
    bus = UnreadableMarket(_bus(), stall_s=0.5)
    clock = Clock()
    _submit_spot(bus, "spot")
    began = time.monotonic()
    processor = Processor(bus, load_rules(), clock=clock)
    try:
        _submit_plain(bus, "plain")
        for _ in range(20):
            turn = time.monotonic()
            processor.run_once(timeout_s=0.01)
            assert time.monotonic() - turn < 0.25, "a turn waited for the market topic"
        assert time.monotonic() - began < market_feed.LOOKUP_WAIT_S + 20 * 0.25
        assert [d.kind for d in _decisions(bus, "plain")] == [DecisionKind.START_JOB]
        assert [d.kind for d in _decisions(bus, "spot")] == [DecisionKind.QUEUE_JOB]
        deadline = time.monotonic() + 10
        while processor.counters.market_unreadable < 2 and time.monotonic() < deadline:
            processor.run_once(timeout_s=0.05)
        assert processor.counters.market_unreadable >= 2  # counted at every failed look, said once

        bus.readable.set()  # Read granted: the next look finds the end, and live quotes count
        deadline = time.monotonic() + 10
        while processor.market.reader.opened is None and time.monotonic() < deadline:
            processor.run_once(timeout_s=0.05)
        clock.at = T0 + 1
        _publish(bus, _quote(0.3, 0, T0 + 1))
        _turns(processor)
        assert [d.kind for d in _decisions(bus, "spot")] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    finally:
        bus.readable.set()
        processor.close()
