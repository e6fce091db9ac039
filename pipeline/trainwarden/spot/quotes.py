"""Market quotes on the bus: what a provider's answer must be to be published,
and how a processor judges the quotes it reads (pure: times come in as data).

The market service (services/market_service.py) publishes a full snapshot of
its market at every change and, unchanged, again well before the last one
stops holding (``valid_s``). A processor takes a quote for a job only while
it holds: read live (not from the topic's backlog at its start), not late,
and not older than ``valid_s`` on the processor's own clock. Anything else
is "no market data": a queued job stays queued, a running one keeps running
on the last price its engine saw, and nothing starts on a price never seen.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from trainwarden.bus.messages import MarketQuote
from trainwarden.events import Offer
from trainwarden.spot.market import MAX_NOTICE_S

MAX_OFFERS = 10_000  # instance types in one answer: far above any cloud's, small enough to bound a quote
MAX_PRICE = 1e9
MAX_VALID_S = 600.0  # however long a quote says it holds, no longer: a price is not believed for hours
MAX_MARKETS = 64  # markets one processor follows; a quote of any further one is refused (bounded memory)


def checked_offers(answer: object) -> tuple[tuple[Offer, ...], str]:
    """The provider's answer as offers, or () and why it is not one (garbage
    is never published: a price the service cannot vouch for is no price)."""
    try:
        offers = tuple(answer)  # type: ignore[arg-type]
    except TypeError:
        return (), f"the answer is a {type(answer).__name__}, not a list of offers"
    if len(offers) > MAX_OFFERS:
        return (), f"the answer has {len(offers)} offers; the most is {MAX_OFFERS}"
    seen = set()
    for offer in offers:
        if not isinstance(offer, Offer):
            return (), f"an offer is a {type(offer).__name__}, not an Offer"
        problem = _offer_problem(offer)
        if problem:
            return (), f"offer {offer.instance_type!r}: {problem}"
        if offer.instance_type in seen:
            return (), f"instance type {offer.instance_type!r} is offered twice"
        seen.add(offer.instance_type)
    return offers, ""


def _offer_problem(offer: Offer) -> str:
    if not isinstance(offer.instance_type, str) or not offer.instance_type.strip() or len(offer.instance_type) > 200:
        return "the instance type must be a name of 1 to 200 characters"
    for name in ("price", "on_demand", "average_price", "notice_s"):
        value = getattr(offer, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value < MAX_PRICE:
            return f"{name} must be a finite number from 0, not {value!r}"
    if offer.on_demand <= 0:
        return f"on_demand must be above 0, not {offer.on_demand!r}"
    if offer.notice_s > MAX_NOTICE_S:
        return f"notice_s must be at most {MAX_NOTICE_S:g}, not {offer.notice_s!r}"
    if isinstance(offer.stock, bool) or not isinstance(offer.stock, int) or not 0 <= offer.stock < 2**31:
        return f"stock must be a whole number from 0, not {offer.stock!r}"
    return ""


@dataclasses.dataclass
class QuoteCounters:
    quotes: int = 0  # read in all
    backlog: int = 0  # read from the topic's backlog at the start: known, never acted on
    late: int = 0  # arrived later than they hold
    missed: int = 0  # gaps in a market service's sequence
    out_of_order: int = 0  # a sequence number already seen
    invalid: int = 0  # offers that are not a market, a validity out of range, or one market too many


@dataclasses.dataclass(frozen=True)
class Held:
    """A quote that holds, and when this processor got it (its own clock)."""

    quote: MarketQuote
    arrived: float


class MarketView:
    """The newest quote of each market as one processor sees it.

    Lateness is judged without comparing clocks of two processes: within one
    epoch (one market service's life), ``arrived - quote.time`` is the
    transit time plus a constant clock offset; its smallest value so far is
    the offset plus the fastest transit, so a quote whose value exceeds that
    by more than it holds (``valid_s``) came that much later than the fastest
    one did. Differences of one process's own times only."""

    def __init__(self) -> None:
        self.counters = QuoteCounters()
        self._newest: dict[str, Held] = {}
        self._known: dict[str, MarketQuote] = {}  # newest read, held or not (backlog included)
        # Per market, of its newest epoch only (a restarted service's replaces the last):
        self._epoch: dict[str, str] = {}
        self._floor: dict[str, float] = {}  # smallest arrived - time
        self._seq: dict[str, int] = {}

    def take(self, quote: MarketQuote, arrived: float, live: bool) -> bool:
        """One quote read; True when it holds (a job may be given it)."""
        self.counters.quotes += 1
        if not 0 < quote.valid_s <= MAX_VALID_S or checked_offers(quote.offers)[1] \
                or (quote.market not in self._epoch and len(self._epoch) >= MAX_MARKETS):
            self.counters.invalid += 1
            return False
        market = quote.market
        if self._epoch.get(market) != quote.epoch:
            self._epoch[market] = quote.epoch
            self._seq.pop(market, None)
            self._floor.pop(market, None)
        last = self._seq.get(market)
        if last is not None and quote.seq <= last:
            self.counters.out_of_order += 1
            return False
        if last is not None and quote.seq > last + 1:
            self.counters.missed += quote.seq - last - 1  # a full snapshot: the newest is all that matters
        self._seq[market] = quote.seq
        self._known[quote.market] = quote
        if not live:
            self.counters.backlog += 1
            return False
        skew = arrived - quote.time
        floor = self._floor[market] = min(self._floor.get(market, skew), skew)
        if skew - floor > quote.valid_s:
            self.counters.late += 1
            self._newest.pop(quote.market, None)  # what came before it is older still
            return False
        self._newest[quote.market] = Held(quote, arrived)
        return True

    def holding(self, now: float) -> list[Held]:
        """The quotes that still hold at ``now`` (this processor's clock)."""
        return [held for held in self._newest.values() if now - held.arrived <= held.quote.valid_s]

    def offers_for(self, types: set[str], now: float) -> Optional[tuple[Offer, ...]]:
        """The offers of these instance types from quotes that hold, or None
        when any of them has none that holds (no decision on half a market)."""
        found = {}
        for held in self.holding(now):
            for offer in held.quote.offers:
                if offer.instance_type in types:
                    found.setdefault(offer.instance_type, offer)
        if set(found) != types:
            return None
        return tuple(found[t] for t in sorted(types))

    def known(self) -> dict[str, MarketQuote]:
        return dict(self._known)
