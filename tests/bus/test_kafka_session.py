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
