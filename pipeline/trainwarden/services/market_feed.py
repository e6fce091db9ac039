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

# How long a processor's start waits for the market topic before it goes on
# without it (its spot jobs wait for prices; its other jobs do not), and how
# soon a look that failed is tried again.
LOOKUP_WAIT_S = 1.0
LOOKUP_RETRY_S = 10.0


class MarketReader:
    """The market topic's consumer and its end offset when the processor
    started (where live quotes begin), opened on a thread of its own: a
    broker that refuses this processor Read on the topic (a site whose ACLs
    predate it; the Kafka client retries such a lookup for its whole request
    timeout) must neither stop the processor nor stall the turns of every job."""

    def __init__(self, bus: Bus):
        self.opened: Optional[tuple] = None  # (consumer, backlog end) once both are known
        self.failures = 0
        self._said = ""
        self._stop = threading.Event()
        self._done = threading.Event()
        threading.Thread(target=self._open, args=(bus,), name="market-reader", daemon=True).start()
        self._done.wait(LOOKUP_WAIT_S)

    def _open(self, bus: Bus) -> None:
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = bus.consumer([MARKET], None, from_beginning=True)
                self.opened = (consumer, consumer.end_offset(MARKET, 0))
                self._done.set()
                return
            except BusError as exc:
                self.failures += 1
                if consumer is not None:
                    consumer.close()
                if str(exc) != self._said:  # said once, counted every time
                    self._said = str(exc)
                    _log.error("spot jobs wait for prices (every other job goes on): %s Hint: grant this "
                               "processor's user Read on the market topic (deploy/kafka/acls.py); tried again "
                               "every %g s.", str(exc).rstrip(), LOOKUP_RETRY_S)
            self._stop.wait(LOOKUP_RETRY_S)
        self._done.set()

    def close(self) -> None:
        self._stop.set()
        if self._done.wait(LOOKUP_WAIT_S) and self.opened is not None:
            self.opened[0].close()


class MarketFeed:
    def __init__(self, bus: Bus, clock: Callable[[], float]):
        self.clock = clock
        self.view = MarketView()
        self.undecodable = 0
        self.updates = 0  # market updates handed to jobs
        self.reader = MarketReader(bus)
        self._given: dict[str, tuple[Offer, ...]] = {}  # job -> the offers it was last given by this processor

    def poll(self, timeout_s: float = 0.0) -> None:
        if self.reader.opened is None:
            return  # nothing read can be told live from backlog yet
        consumer, backlog_end = self.reader.opened
        for record in consumer.poll(timeout_s, max_records=1000):
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
        self.reader.close()


def send_to_events(producer) -> Callable[[str, bytes], None]:
    return lambda job_id, value: producer.send(EVENTS, job_id, value)
