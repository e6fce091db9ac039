"""The market topic as one processor reads it, and the quotes it hands on.

Every processor reads the whole market topic (one partition, keyed by
market) outside its consumer group, whatever events partitions it owns: a
quote concerns every spot job. What the topic held when the processor
started is its backlog: read to know the last prices, never acted on (it
may be minutes old). A live quote that holds (spot/quotes.py) goes to each
spot job this processor owns whose offers it changes, as the engine's own
``market_update`` event in the job's events partition: the job's engine
steps with it there, in order with the job's other events, and a processor
that takes the job over rebuilds the prices the engine decided on from the
same partition. A job is given a quote again after its owner changed (a new
processor has given it nothing yet), so a taken-over job learns the current
prices from the first quote that holds.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from trainwarden.bus import EVENTS, MARKET, Bus, BusError
from trainwarden.bus.messages import MarketQuote
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.events import MarketUpdate, Offer
from trainwarden.spot.quotes import MarketView


_log = logging.getLogger("trainwarden.processor")

# How long a processor's start waits for the market topic's end before it goes
# on without (its spot jobs wait for it; its other jobs do not), and how soon
# a lookup that failed is tried again.
LOOKUP_WAIT_S = 1.0
LOOKUP_RETRY_S = 10.0


class BacklogEnd:
    """The market topic's end offset when the processor started (where live
    quotes begin), looked up on a thread of its own: a broker that cannot
    answer it (no Read on the topic, which the Kafka client retries for its
    whole request timeout) must not stall the turns of every job."""

    def __init__(self, bus: Bus):
        self.value: Optional[int] = None
        self.failures = 0
        self._said = ""
        self._stop = threading.Event()
        self._found = threading.Event()
        threading.Thread(target=self._look, args=(bus,), name="market-backlog-end", daemon=True).start()
        self._found.wait(LOOKUP_WAIT_S)

    def _look(self, bus: Bus) -> None:
        while not self._stop.is_set():
            try:
                consumer = bus.consumer([MARKET], None)
                try:
                    self.value = consumer.end_offset(MARKET, 0)
                finally:
                    consumer.close()
                self._found.set()
                return
            except BusError as exc:
                self.failures += 1
                if str(exc) != self._said:  # said once, counted every time
                    self._said = str(exc)
                    _log.error("the market topic cannot be read, so spot jobs wait for prices (other jobs go on): "
                               "%s Hint: grant this processor's user Read on %s (deploy/kafka/acls.py); tried "
                               "again every %g s.", exc, MARKET, LOOKUP_RETRY_S)
            self._stop.wait(LOOKUP_RETRY_S)

    def close(self) -> None:
        self._stop.set()


class MarketFeed:
    def __init__(self, bus: Bus, clock: Callable[[], float]):
        self.clock = clock
        self.view = MarketView()
        self.undecodable = 0
        self.updates = 0  # market updates handed to jobs
        self.consumer = bus.consumer([MARKET], None, from_beginning=True)
        self.backlog_end = BacklogEnd(bus)  # offset where live quotes begin: the end at the start
        self._given: dict[str, tuple[Offer, ...]] = {}  # job -> the offers it was last given by this processor

    def poll(self, timeout_s: float = 0.0) -> None:
        backlog_end = self.backlog_end.value
        if backlog_end is None:
            return  # nothing read can be told live from backlog yet
        for record in self.consumer.poll(timeout_s, max_records=1000):
            try:
                quote = decode(MARKET, record.value)
            except DecodeError:
                self.undecodable += 1  # counted; a signing bus has already dead-lettered what it refused
                continue
            assert isinstance(quote, MarketQuote)
            self.view.take(quote, self.clock(), live=record.offset >= backlog_end)

    def hand_on(self, jobs: dict, skip: Callable[[str], bool], send: Callable[[str, bytes], None]) -> None:
        """Each owned, unfinished spot job whose offers the holding quotes
        change gets them as a market update (``send(job_id, value)`` to the events topic)."""
        now = self.clock()
        for job_id in [j for j in self._given if j not in jobs or jobs[j].finished]:
            del self._given[job_id]
        for job_id, state in jobs.items():
            if state.spot is None or state.finished or skip(job_id):
                continue
            offers = self.view.offers_for({bid.instance_type for bid in state.spot.bids}, now)
            if offers is None or self._given.get(job_id) == offers:
                continue
            self._given[job_id] = offers
            self.updates += 1
            send(job_id, encode(MarketUpdate(job_id=job_id, time=now, offers=offers)))

    def forget(self, job_ids) -> None:
        """Jobs this processor no longer owns (or owns anew): given nothing yet."""
        for job_id in job_ids:
            self._given.pop(job_id, None)

    def close(self) -> None:
        self.backlog_end.close()
        self.consumer.close()


def send_to_events(producer) -> Callable[[str, bytes], None]:
    return lambda job_id, value: producer.send(EVENTS, job_id, value)
