"""What an idle client costs on a real broker: a consumer that asks rarely
still gets a message at once, and a flush with nothing sent does not wake the
producer's sender (an agent's loop flushes 20 times a second)."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from trainwarden.bus.base import TopicSpec
from trainwarden.bus.kafka import KafkaBus


@pytest.fixture()
def bus_and_topic():
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    bus = KafkaBus(bootstrap)
    topic = f"twt-idle-{uuid.uuid4().hex[:6]}"
    bus.create_topics([TopicSpec(topic, 1)])
    return bus, topic


def test_a_consumer_whose_fetches_wait_10_s_gets_a_message_sent_meanwhile_at_once(bus_and_topic):
    bus, topic = bus_and_topic
    consumer = bus.consumer([topic], f"{topic}-g", from_beginning=False, fetch_wait_s=10.0)
    producer = bus.producer()
    try:
        assert consumer._consumer.config["fetch_max_wait_ms"] == 10_000
        deadline = time.monotonic() + 30
        while not consumer.ready():
            assert time.monotonic() < deadline, "never assigned"
            consumer.poll(0.1)
        consumer.poll(1.0)  # a fetch is now waiting at the broker
        sent = threading.Event()

        def send_soon():
            time.sleep(0.5)
            producer.send(topic, "k", b"hello")
            producer.flush()
            sent.set()

        threading.Thread(target=send_soon, daemon=True).start()
        records, started = [], time.monotonic()
        while not records and time.monotonic() - started < 20:
            records = consumer.poll(0.2)
        took = time.monotonic() - started
        assert [r.value for r in records] == [b"hello"]
        assert took < 5.0, f"the message waited out the fetch ({took:.1f} s)"
    finally:
        consumer.close()
        producer.close()


class _CountingFlushes:
    def __init__(self, inner):
        self.inner, self.flushes = inner, 0

    def flush(self, timeout=None):
        self.flushes += 1
        return self.inner.flush(timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_flush_waits_only_when_something_was_sent_since_the_last(bus_and_topic):
    bus, topic = bus_and_topic
    producer = bus.producer()
    counting = producer._producer = _CountingFlushes(producer._producer)
    try:
        producer.flush()
        assert counting.flushes == 0
        producer.send(topic, "k", b"one")
        producer.flush()
        producer.flush()
        assert counting.flushes == 1
        producer.send(topic, "k", b"two")
        producer.flush()
        assert counting.flushes == 2
        reader = bus.consumer([topic], None, from_beginning=True)
        got, deadline = [], time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for r in reader.poll(0.2)]
        reader.close()
        assert got == [b"one", b"two"]
    finally:
        producer.close()
