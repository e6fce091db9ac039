"""The market on the bus, in process: the market service's quotes, and the
processor that hands them to the spot jobs it owns (services/market_feed.py)."""

from __future__ import annotations

import threading
import time

import pytest

from trainwarden.bus import DECISIONS, EVENTS, MARKET, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import MarketQuote
from trainwarden.bus.serde import decode, encode
from trainwarden.events import DecisionKind, JobSubmitted, MarketUpdate, Offer, SpotBid
from trainwarden.rules.loader import load_rules
from trainwarden.services.market_service import MarketService
from trainwarden.services.processor import Processor
from trainwarden.simulation.cluster import instance_specs
from trainwarden.spot.market import InstanceType, Pool
from trainwarden.spot.quotes import MarketView, checked_offers

T0 = 1_800_000_000.0
TYPE = "ecs.g7.xlarge"
BID = SpotBid(role="worker", instance_type=TYPE, count=2, price_limit=0.5)


def _offer(price: float, stock: int = 8) -> Offer:
    return Offer(instance_type=TYPE, price=price, stock=stock, on_demand=1.2, notice_s=2.0)


class Clock:
    def __init__(self, at: float = T0):
        self.at = at

    def __call__(self) -> float:
        return self.at


class Provider:
    """A market whose answer the test sets (or makes raise, hang, or be garbage)."""

    name = "testcloud"

    def __init__(self):
        self.answer: object = (_offer(0.3),)
        self.release = threading.Event()
        self.release.set()

    def pools(self):
        return {"default": Pool("default")}

    def instance_types(self):
        return {TYPE: InstanceType(TYPE, "default", 1.2)}

    def offers(self, at: float):
        self.release.wait(30)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _bus() -> MemoryBus:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    return bus


def _quotes(bus) -> list[MarketQuote]:
    consumer = bus.consumer([MARKET], None, from_beginning=True)
    return [decode(MARKET, r.value) for r in consumer.poll(0.1, 10_000)]


def _decisions(bus, job_id="j1"):
    consumer = bus.consumer([DECISIONS], None, from_beginning=True)
    return [d for d in (decode(DECISIONS, r.value) for r in consumer.poll(0.1, 10_000) if r.key == job_id)]


def _submit_spot(bus, job_id="j1"):
    producer = bus.producer()
    producer.send(EVENTS, job_id, encode(JobSubmitted(job_id=job_id, time=T0, framework="pytorch", args="",
                                                      instances=instance_specs([("worker", 2)]), spot=(BID,))))
    producer.flush()


def _quote(price: float, seq: int, at_time: float, epoch: str = "e1", valid_s: float = 3.0) -> MarketQuote:
    return MarketQuote(market="testcloud", epoch=epoch, seq=seq, time=at_time, at=at_time - T0, valid_s=valid_s,
                       offers=(_offer(price),))


def _publish(bus, quote: MarketQuote) -> None:
    producer = bus.producer()
    producer.send(MARKET, quote.market, encode(quote))
    producer.flush()


def _turns(processor, times=3):
    for _ in range(times):
        processor.run_once(timeout_s=0.01)


# ------------------------------------------------------------ the service


def test_the_market_service_publishes_a_quote_at_a_change_and_again_only_when_it_is_due():
    bus = _bus()
    provider = Provider()
    service = MarketService(bus, provider, interval_s=0.05, clock=Clock())
    service.poll()
    service.poll()  # unchanged, and the refresh is not due
    provider.answer = (_offer(0.9),)
    service.poll()
    quotes = _quotes(bus)
    assert [(q.seq, q.offers[0].price) for q in quotes] == [(0, 0.3), (1, 0.9)]
    assert quotes[0].epoch == quotes[1].epoch and quotes[0].valid_s == 3 * service.refresh_s
    service.close()


@pytest.mark.parametrize("answer, counter, said", [
    (RuntimeError("HTTP 503"), "provider_errors", "could not be read (RuntimeError('HTTP 503'))"),
    ("garbage", "provider_garbage", "an offer is a str, not an Offer"),
    ((Offer(instance_type=TYPE, price=float("nan"), stock=1, on_demand=1.2),), "provider_garbage",
     "price must be a finite number"),
    ((Offer(instance_type=TYPE, price=0.3, stock=-1, on_demand=1.2),), "provider_garbage", "stock must be"),
])
def test_a_provider_that_fails_or_answers_garbage_publishes_nothing_and_is_said_once_and_counted(
        answer, counter, said):
    bus = _bus()
    provider = Provider()
    told: list[str] = []
    service = MarketService(bus, provider, interval_s=0.05, clock=Clock(), say=told.append)
    service.poll()
    provider.answer = answer
    for _ in range(3):
        service.poll()
    provider.answer = (_offer(0.9),)
    service.poll()
    assert [q.offers[0].price for q in _quotes(bus)] == [0.3, 0.9]
    assert getattr(service.counters, counter) == 3
    assert len(told) == 2 and said in told[0] and told[1] == "market testcloud answers again", told
    service.close()


def test_a_provider_that_stops_answering_publishes_nothing_and_does_not_stop_the_service():
    bus = _bus()
    provider = Provider()
    told: list[str] = []
    service = MarketService(bus, provider, interval_s=0.05, timeout_s=0.1, clock=Clock(), say=told.append)
    provider.release.clear()
    deadline = time.monotonic() + 10
    while service.counters.provider_timeouts < 3 and time.monotonic() < deadline:
        service.run_once()  # a poll every interval; each waits for the hung call at most that long
    assert _quotes(bus) == [] and service.counters.provider_timeouts == 3
    assert len(told) == 1 and "has not answered for" in told[0], told
    provider.release.set()
    while not service.counters.quotes and time.monotonic() < deadline:
        service.run_once()
    assert [q.offers[0].price for q in _quotes(bus)] == [0.3]
    assert told[1:] == ["market testcloud answers again"]
    service.close()


# ------------------------------------------------------------ judging quotes


def test_a_quote_from_the_backlog_is_known_but_never_holds():
    view = MarketView()
    assert not view.take(_quote(0.3, 0, T0), T0 + 1, live=False)
    assert view.offers_for({TYPE}, T0 + 1) is None and view.known()["testcloud"].seq == 0


def test_a_quote_that_arrives_later_than_it_holds_is_not_taken_and_drops_the_one_before():
    view = MarketView()
    assert view.take(_quote(0.9, 0, T0), T0 + 0.1, live=True)
    assert view.take(_quote(0.9, 1, T0 + 1), T0 + 1.1, live=True)
    # Polled 1 s after the one before, read 5 s after it: 4 s late, and it holds 3 s.
    assert not view.take(_quote(0.3, 2, T0 + 2), T0 + 6.1, live=True)
    assert view.counters.late == 1 and view.offers_for({TYPE}, T0 + 6.1) is None


def test_a_quote_stops_holding_after_its_validity_on_the_readers_clock():
    view = MarketView()
    view.take(_quote(0.3, 0, T0), T0 + 0.1, live=True)
    assert view.offers_for({TYPE}, T0 + 3.0) == (_offer(0.3),)
    assert view.offers_for({TYPE}, T0 + 3.2) is None


def test_a_quote_seen_before_is_not_taken_again_and_a_gap_is_counted():
    view = MarketView()
    view.take(_quote(0.3, 0, T0), T0, live=True)
    view.take(_quote(0.3, 3, T0 + 1), T0 + 1, live=True)
    assert not view.take(_quote(0.9, 2, T0 + 1), T0 + 1.2, live=True)
    assert (view.counters.missed, view.counters.out_of_order) == (2, 1)
    assert view.offers_for({TYPE}, T0 + 1.2) == (_offer(0.3),)


@pytest.mark.parametrize("quote", [
    MarketQuote(market="testcloud", epoch="e1", seq=0, time=T0, at=0.0, valid_s=1e9, offers=(_offer(0.3),)),
    MarketQuote(market="testcloud", epoch="e1", seq=0, time=T0, at=0.0, valid_s=3.0,
                offers=(Offer(instance_type=TYPE, price=float("nan"), stock=8, on_demand=1.2),)),
])
def test_a_quote_that_holds_for_ever_or_is_not_a_market_is_refused_even_signed(quote):
    view = MarketView()
    assert not view.take(quote, T0, live=True)
    assert view.counters.invalid == 1 and view.offers_for({TYPE}, T0) is None


def test_a_restarted_market_service_starts_its_sequence_and_its_lateness_anew():
    view = MarketView()
    view.take(_quote(0.3, 7, T0), T0, live=True)
    # The new service's clock may be anywhere: its first quote sets its own baseline.
    assert view.take(_quote(0.9, 0, T0 - 50, epoch="e2"), T0 + 1, live=True)
    assert view.offers_for({TYPE}, T0 + 1) == (_offer(0.9),) and view.counters.out_of_order == 0


def test_checked_offers_refuses_a_type_offered_twice():
    assert checked_offers((_offer(0.3), _offer(0.4)))[1] == f"instance type {TYPE!r} is offered twice"


# ------------------------------------------------------------ the processor


def test_a_processor_starts_a_queued_spot_job_on_the_first_live_quote_that_allows_it():
    bus = _bus()
    clock = Clock()
    _submit_spot(bus)
    processor = Processor(bus, load_rules(), clock=clock)
    _turns(processor)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB]
    _publish(bus, _quote(0.9, 0, T0))  # above the bid
    _turns(processor)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB]
    clock.at = T0 + 1
    _publish(bus, _quote(0.3, 1, T0 + 1))
    _turns(processor)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    assert processor.counters.market_updates == 2
    processor.close()


def test_a_processor_does_not_start_a_job_on_the_prices_it_found_on_the_topic_at_its_start():
    bus = _bus()
    clock = Clock()
    _publish(bus, _quote(0.3, 0, T0))  # published before the processor started: maybe long ago
    _submit_spot(bus)
    processor = Processor(bus, load_rules(), clock=clock)
    _turns(processor)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB]
    assert processor.counters.market_quotes_not_taken == 1
    _publish(bus, _quote(0.3, 1, T0 + 1))
    clock.at = T0 + 1
    _turns(processor)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    processor.close()


def _started(bus, clock) -> Processor:
    """A spot job submitted, and started by a processor on a quote below its bid."""
    _submit_spot(bus)
    processor = Processor(bus, load_rules(), clock=clock)
    _publish(bus, _quote(0.3, 0, T0))
    _turns(processor)
    return processor


def test_a_running_spot_job_keeps_running_when_the_quotes_stop_and_is_released_on_a_rise():
    bus = _bus()
    clock = Clock()
    processor = _started(bus, clock)
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    clock.at = T0 + 60  # the market service is gone: its last quote stopped holding long ago
    _turns(processor)
    processor.tick()
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    _publish(bus, _quote(0.9, 0, T0 + 60, epoch="e2"))  # a new market service
    _turns(processor)
    kinds = [d.kind for d in _decisions(bus)]
    assert kinds == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB, DecisionKind.REQUEUE], kinds
    assert _decisions(bus)[-1].notice_s == 2.0
    processor.close()


def test_a_processor_that_takes_a_job_over_rebuilds_its_prices_from_the_jobs_partition():
    bus = _bus()
    clock = Clock()
    _started(bus, clock).close()
    clock.at = T0 + 30
    second = Processor(bus, load_rules(), clock=clock)
    _turns(second)
    spot = second.jobs["j1"].spot
    assert spot.offers[TYPE].price == 0.3 and spot.phase.value == "running"
    # The updates the job was given are in its own events partition.
    consumer = bus.consumer([EVENTS], None, from_beginning=True)
    updates = [m for m in (decode(EVENTS, r.value) for r in consumer.poll(0.1, 10_000)) if isinstance(m, MarketUpdate)]
    assert [u.offers[0].price for u in updates] == [0.3]
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.QUEUE_JOB, DecisionKind.START_JOB]
    second.close()


# ------------------------------------------------------------ the command


def test_the_market_command_refuses_to_start_without_a_market_or_on_a_bad_trace(cli, tmp_path):
    missing = cli("market", "--bootstrap", "127.0.0.1:1", env={"TRAINWARDEN_MARKET": ""})
    assert missing.code == 2 and "the market service needs --market" in missing.err, missing
    trace = tmp_path / "market.yaml"
    trace.write_text("instance_types:\n  ecs.g7.xlarge: {on_demand: -1}\nprices: []\n")
    bad = cli("market", "--market", str(trace), "--bootstrap", "127.0.0.1:1")
    assert bad.code == 2 and "market.yaml:2:" in bad.err and "'on_demand' must be a price above 0" in bad.err, bad
    fast = cli("market", "--market", str(trace), "--interval", "0", "--bootstrap", "127.0.0.1:1")
    assert fast.code == 2 and "--interval must be from 0.05 to 3600 seconds" in fast.err, fast
