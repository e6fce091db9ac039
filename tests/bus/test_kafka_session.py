"""The consumers' session timeout: an explicit, validated setting
(TRAINWARDEN_KAFKA_SESSION_TIMEOUT_MS) with a default that a broker from
deploy/kafka grants; a stock broker's refusal is covered where a broker
runs (tests/cluster/takeover.py probes which kind it is)."""

import pytest

from trainwarden.bus.base import BusError
from trainwarden.bus.kafka import SESSION_ENV, SESSION_TIMEOUT_MS, heartbeat_interval_ms, session_timeout_ms


def test_without_the_setting_consumers_ask_for_2_s_sessions_and_say_it_was_not_chosen():
    assert session_timeout_ms({}) == (SESSION_TIMEOUT_MS, False) == (2000, False)


def test_an_operator_can_ask_for_the_stock_brokers_6_s():
    assert session_timeout_ms({SESSION_ENV: "6000"}) == (6000, True)


@pytest.mark.parametrize("value", ["2s", "999", "300001", "-5", "1e4"])
def test_a_session_timeout_that_is_not_whole_milliseconds_in_bounds_is_refused_naming_the_variable(value):
    with pytest.raises(BusError) as refused:
        session_timeout_ms({SESSION_ENV: value})
    assert SESSION_ENV in str(refused.value) and "6000" in refused.value.hint


def test_a_member_heartbeats_four_times_a_session_but_at_least_once_a_second():
    assert [heartbeat_interval_ms(ms) for ms in (1000, 2000, 6000, 10000)] == [250, 500, 1000, 1000]


def test_on_a_stock_broker_every_group_consumer_of_a_bus_joins_with_6_s_sessions_said_once(caplog):
    """On a broker that keeps the stock group.min.session.timeout.ms (6 s):
    a second consumer refused after the first fell back must not be taken for
    an operator's refused choice (it once was: the actuator never joined)."""
    import os
    import time
    import uuid

    from trainwarden.bus.base import TopicSpec
    from trainwarden.bus.kafka import STOCK_MIN_SESSION_MS, KafkaBus

    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    os.environ.pop(SESSION_ENV, None)
    bus = KafkaBus(bootstrap)
    topic = f"twt-session-{uuid.uuid4().hex[:6]}"
    bus.create_topics([TopicSpec(topic, 1)])
    consumers = [bus.consumer([topic], f"{topic}-{n}", from_beginning=True) for n in range(2)]
    try:
        deadline = time.monotonic() + 30
        while not all(c.ready() for c in consumers) and time.monotonic() < deadline:
            for consumer in consumers:
                consumer.poll(0.1)
        if bus.session_ms == SESSION_TIMEOUT_MS:
            pytest.skip(f"the broker at {bootstrap} grants {SESSION_TIMEOUT_MS} ms sessions: no fallback to check")
        assert all(c.ready() for c in consumers) and bus.session_ms == STOCK_MIN_SESSION_MS
        assert sum("refuses consumer sessions" in r.getMessage() for r in caplog.records) == 1
    finally:
        for consumer in consumers:
            consumer.close()
