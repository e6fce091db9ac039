"""A signed message's age on pinned clocks: judged on the broker's append time
when the topic records it, so neither a step of a producer's host nor a skew
of the consumer's refuses a genuine message, while a copy appended long after
its signing is still refused."""

import dataclasses

import pytest

from trainwarden.bus import COMMANDS
from trainwarden.bus.base import Message
from trainwarden.bus.signing import MAX_AHEAD_S, Keyring, SigningConfig, Verifier, seal

T0 = 1_800_000_000.0
K1 = Keyring((("k1", b"a" * 16 + b"1" * 16),))
COMMAND = b'{"v":1,"type":"stop_instances","node":"n1","job_id":"j1","action_id":"a1","instances":["worker-0"]}'


def _record(signed_at: float, appended_at: float | None, offset: int = 7, message_id: str = "0" * 32) -> Message:
    value = seal(K1, COMMANDS, "n1", COMMAND, signed_at, message_id)
    return Message(COMMANDS, "n1", value, 0, offset, int(signed_at * 1000),
                   int(appended_at * 1000) if appended_at is not None else 0)


def _open(record: Message, consumer_now: float, backlog: bool = False):
    return Verifier(SigningConfig(K1, max_age_s=600.0)).open(record, consumer_now, backlog)


@pytest.mark.parametrize("consumer_skew_s", [-3600.0, -4.0, 4.0, 3600.0])
def test_a_consumer_whose_clock_is_off_takes_a_fresh_message_by_its_append_time(consumer_skew_s):
    verdict = _open(_record(T0, appended_at=T0 + 0.05), consumer_now=T0 + consumer_skew_s)
    assert verdict.message is not None and verdict.message.value == COMMAND


@pytest.mark.parametrize("producer_skew_s", [4.0, 3600.0, MAX_AHEAD_S])
def test_a_producer_whose_clock_is_ahead_is_not_refused(producer_skew_s):
    # A submit started after a +1 h step of its host, or on a host an hour ahead.
    assert _open(_record(T0 + producer_skew_s, appended_at=T0), consumer_now=T0).message is not None


def test_a_producer_more_than_a_day_ahead_is_refused_saying_to_check_its_clock():
    verdict = _open(_record(T0 + MAX_AHEAD_S + 10, appended_at=T0), consumer_now=T0)
    assert verdict.refusal == "expired"
    assert verdict.reason == ("expired: signed 86410 s after it was appended; a producer's clock may be at most "
                              "86400 s ahead: check its time")


def test_a_copy_appended_long_after_its_signing_is_refused_whatever_the_consumers_clock():
    for consumer_now in (T0 + 601, T0 - 3600.0, T0 + 7200.0):
        verdict = _open(_record(T0, appended_at=T0 + 601), consumer_now=consumer_now)
        assert verdict.refusal == "expired"
        assert verdict.reason == ("expired: signed 601 s before it was appended; the most is 600 s "
                                  "(--signing-max-age); or its producer's clock is that far behind the broker's")


def test_a_copy_of_a_message_already_read_is_refused_as_replayed_even_when_fresh():
    verifier = Verifier(SigningConfig(K1, max_age_s=600.0))
    original = _record(T0, appended_at=T0, offset=7)
    assert verifier.open(original, T0, backlog=False).message is not None
    copy = dataclasses.replace(original, offset=9, append_ms=int((T0 + 1) * 1000))
    assert verifier.open(copy, T0 + 1, backlog=False).refusal == "replayed"


def test_without_an_append_time_the_age_is_the_consumers_and_only_old_messages_are_refused():
    assert _open(_record(T0, appended_at=None), consumer_now=T0 - 3600.0).message is not None  # the producer ahead
    verdict = _open(_record(T0, appended_at=None), consumer_now=T0 + 601)
    assert verdict.reason == "expired: signed 601 s before it was read; the most is 600 s (--signing-max-age)"


def test_what_a_partition_held_at_assignment_is_read_at_any_age_with_or_without_an_append_time():
    assert _open(_record(T0, appended_at=T0 + 86400 * 3), consumer_now=T0, backlog=True).message is not None
    assert _open(_record(T0, appended_at=None), consumer_now=T0 + 86400 * 3, backlog=True).message is not None
