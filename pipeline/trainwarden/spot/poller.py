"""Polling a market provider at the edge of a run: the engine only ever sees
the answers, as ``MarketUpdate`` events with their time as data."""

from __future__ import annotations

from typing import Callable, Optional

from trainwarden.events import MarketUpdate, Offer
from trainwarden.spot.market import MarketProvider

DEFAULT_INTERVAL_S = 0.2


class MarketPoller:
    """Asks the provider at most every ``interval_s`` and yields an update
    only when the offers changed (the engine re-evaluates on each update)."""

    def __init__(self, provider: MarketProvider, job_id: str, origin: float,
                 interval_s: float = DEFAULT_INTERVAL_S, on_error: Optional[Callable[[str], None]] = None):
        self.provider = provider
        self.job_id = job_id
        self.origin = origin  # the job's submission: trace times count from here
        self.interval_s = interval_s
        self.on_error = on_error
        self.errors = 0
        self._next = 0.0
        self._last: Optional[tuple[Offer, ...]] = None

    def poll(self, moment: float) -> Optional[MarketUpdate]:
        if moment < self._next:
            return None
        self._next = moment + self.interval_s
        try:
            offers = tuple(self.provider.offers(moment - self.origin))
        except Exception as exc:  # noqa: BLE001 - a market outage must not stop supervision
            self.errors += 1
            if self.errors == 1 and self.on_error:
                self.on_error(f"market {self.provider.name} could not be read ({exc!r}); retrying")
            return None
        if offers == self._last:
            return None
        self._last = offers
        return MarketUpdate(job_id=self.job_id, time=moment, offers=offers)
