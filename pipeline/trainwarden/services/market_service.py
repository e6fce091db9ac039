"""``trainwarden market``: the spot market on the bus.

Polls one provider (a trace, or any ``register_provider`` scheme, as
``run --market`` takes) every ``interval_s`` and publishes what it answers
as a signed ``MarketQuote`` on the market topic, keyed by the market's name:
at once when the offers change, and unchanged again every ``refresh_s`` so
that a processor can tell a quiet market from a dead service (a quote holds
``valid_s``, three refresh periods). Every processor reads the topic in
full, outside its consumer group (services/market_feed.py).

A provider that raises, answers garbage, or does not answer within
``timeout_s`` gets no quote published: the last one stops holding, queued
jobs stay queued and running ones keep running on the price they last saw.
The service says why once per outage (and when the provider is back), and
counts it. The provider is called on a worker thread so that a hung one
cannot stop the loop; a call still hanging is not called again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import secrets
import time
from typing import Callable, Optional

from trainwarden.bus import MARKET, Bus
from trainwarden.bus.messages import MarketQuote
from trainwarden.bus.serde import encode
from trainwarden.clock import now as clock_now
from trainwarden.events import Offer
from trainwarden.spot.market import MarketProvider
from trainwarden.spot.quotes import checked_offers

DEFAULT_INTERVAL_S = 0.5
DEFAULT_TIMEOUT_S = 10.0


@dataclasses.dataclass
class MarketCounters:
    polls: int = 0
    quotes: int = 0  # published
    changes: int = 0  # quotes whose offers differ from the one before
    provider_errors: int = 0  # the provider raised
    provider_garbage: int = 0  # it answered something that is not a list of valid offers
    provider_timeouts: int = 0  # polls skipped while a call hung


class MarketService:
    def __init__(self, bus: Bus, provider: MarketProvider, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = clock_now,
                 say: Callable[[str], None] = lambda text: None):
        self.provider = provider
        self.interval_s = interval_s
        self.refresh_s = max(interval_s, 1.0)
        self.valid_s = 3 * self.refresh_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.say = say
        self.counters = MarketCounters()
        self.epoch = secrets.token_hex(8)
        self.seq = 0
        # The market's origin: a trace's time 0 is this service's start (its own clock only).
        self.origin = clock()
        self.producer = bus.producer()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="market-provider")
        self._call: Optional[concurrent.futures.Future] = None
        self._called_at = 0.0
        self._last: Optional[tuple[Offer, ...]] = None
        self._published_at = -float("inf")
        self._next_poll = 0.0
        self._trouble = ""  # the outage being said: said once, and its end

    def run_once(self) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            time.sleep(min(0.1, self._next_poll - now))
            return
        self._next_poll = now + self.interval_s
        self.poll()

    def poll(self) -> None:
        """One poll: a quote published if the provider answered well and it is due."""
        self.counters.polls += 1
        if self._call is not None and not self._call.done():
            if time.monotonic() - self._called_at >= self.timeout_s:
                self.counters.provider_timeouts += 1
                self._trouble_is("timeout", f"market {self.provider.name} has not answered for "
                                 f"{time.monotonic() - self._called_at:.1f} s; no quote is published meanwhile")
            return
        moment = self.clock()
        at = moment - self.origin
        self._call = self._pool.submit(self.provider.offers, at)
        self._called_at = time.monotonic()
        try:
            answer = self._call.result(timeout=min(self.timeout_s, self.interval_s))
        except concurrent.futures.TimeoutError:
            return  # taken up at the next poll, or counted as hung there
        except Exception as exc:  # noqa: BLE001 - a provider's failure must not stop the service
            self._call = None
            self.counters.provider_errors += 1
            self._trouble_is("error", f"market {self.provider.name} could not be read ({repr(exc)[:300]}); "
                                      "no quote is published until it answers")
            return
        self._call = None
        offers, problem = checked_offers(answer)
        if problem:
            self.counters.provider_garbage += 1
            self._trouble_is("garbage", f"market {self.provider.name} answered something that is not a market: "
                                        f"{problem[:300]}; no quote is published until it answers well")
            return
        if self._trouble:
            self.say(f"market {self.provider.name} answers again")
            self._trouble = ""
        changed = offers != self._last
        if not changed and time.monotonic() - self._published_at < self.refresh_s:
            return
        self._publish(MarketQuote(market=self.provider.name, epoch=self.epoch, seq=self.seq, time=moment,
                                  at=round(at, 6), valid_s=self.valid_s, offers=offers), changed)

    def _publish(self, quote: MarketQuote, changed: bool) -> None:
        self.producer.send(MARKET, quote.market, encode(quote))
        self.producer.flush()
        self.seq += 1
        self.counters.quotes += 1
        self.counters.changes += int(changed)
        self._last = quote.offers
        self._published_at = time.monotonic()

    def _trouble_is(self, kind: str, text: str) -> None:
        if self._trouble != kind:
            self._trouble = kind
            self.say(text)

    def close(self) -> None:
        try:
            self.producer.flush(5)
        finally:
            self.producer.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
