"""A consumer's lag per partition, as the metrics read it (Consumer.lags):
what is behind the end, from what the client already knows."""

from trainwarden.bus.base import TopicSpec
from trainwarden.bus.memory import MemoryBus


def test_the_lag_is_what_was_produced_and_not_yet_polled_per_partition():
    bus = MemoryBus()
    bus.create_topics([TopicSpec("t", 2)])
    consumer = bus.consumer(["t"], None, from_beginning=True)
    consumer.poll(0.01)
    assert consumer.lags() == {("t", 0): 0, ("t", 1): 0}
    producer = bus.producer()
    for i in range(5):
        producer.send("t", "same-key", b"%d" % i)
    partition = next(p for (_, p), lag in consumer.lags().items() if lag)
    assert consumer.lags() == {("t", partition): 5, ("t", 1 - partition): 0}
    assert len(consumer.poll(0.1, max_records=2)) == 2
    assert consumer.lags()[("t", partition)] == 3
    consumer.poll(0.1)
    assert set(consumer.lags().values()) == {0}
