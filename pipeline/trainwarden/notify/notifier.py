"""The notifier: events in, signed webhooks out, every step durable and logged.

``submit(event)`` matches the event against the subscriptions and queues one
delivery per match on disk before returning (a few fsyncs; it never waits for
the network and never raises for a delivery problem). Delivery runs in
``run_once()`` or in a background thread (``start()``): a subscription's
deliveries go out one at a time in submission order (a receiver sees a job's
events in order, and a failing endpoint is not hammered in parallel), while
different subscriptions are served by parallel workers.

Rate limiting: at most one message per (subscription, job, type) per
``rate_limit_s``. Events inside a window are suppressed; the latest one is
held and sent when the window ends, carrying how many were suppressed before
it, so every event is either sent or counted in exactly one message. Over
that, per (subscription, job) whatever the types, at most
``job_limit.max_messages`` messages go out per ``job_limit.interval_s``: an
event past it is held the same way (the latest of its type, counted) until
the job's window ends, so one job cannot flood a receiver even with the
per-type limit off.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import queue
import random
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from trainwarden.events import Decision
from trainwarden.notify.events import NotificationEvent, events_from_decision
from trainwarden.notify.model import Subscription
from trainwarden.notify.queue import DurableQueue, Entry
from trainwarden.notify.records import DeliveryRecord, DeliveryStatus, DeliveryWriter, JsonlDeliveryLog
from trainwarden.notify.safety import redact
from trainwarden.notify.templates import RenderError
from trainwarden.notify.transport import Attempt, Resolver, backoff, send_once, system_resolver

log = logging.getLogger("trainwarden.notify")
S = DeliveryStatus


@dataclasses.dataclass(frozen=True)
class NotifierSettings:
    max_pending: int = 10_000  # deliveries on disk; past it new ones are refused (dead, "queue full")
    max_pending_bytes: int = 64 * 1024 * 1024
    workers: int = 4  # subscriptions served at once
    response_limit: int = 64 * 1024  # bytes of a response body read


def delivery_id(event_id: str, subscription: str) -> str:
    return "dlv_" + hashlib.sha256(f"{event_id}\x1f{subscription}".encode()).hexdigest()[:24]


class Notifier:
    def __init__(self, subscriptions: Iterable[Subscription], directory: str | Path, *,
                 writer: Optional[DeliveryWriter] = None, settings: NotifierSettings = NotifierSettings(),
                 clock: Callable[[], float] = time.time, env: Optional[Mapping[str, str]] = None,
                 allow_loopback: bool = False, resolver: Resolver = system_resolver,
                 rng: Optional[random.Random] = None):
        self.subs = {s.name: s for s in subscriptions}
        self.directory = Path(directory)
        self.queue = DurableQueue(self.directory)
        self.writer = writer if writer is not None else JsonlDeliveryLog(self.directory / "deliveries.jsonl")
        self.settings = settings
        self.clock = clock
        self.env = os.environ if env is None else env
        self.allow_loopback = allow_loopback
        self.resolver = resolver
        self.rng = rng or random.Random()
        self.counters: collections.Counter = collections.Counter()
        self._cond = threading.Condition()
        self._log_lock = threading.Lock()
        self._inflight: set[str] = set()
        self._versions: dict[str, float] = {}
        self._seq = self.queue.next_seq
        self._thread: Optional[threading.Thread] = None
        # Daemon workers, not a ThreadPoolExecutor: the interpreter joins an
        # executor's threads at exit, so an attempt still waiting for a slow
        # receiver would hold a stopping process long past its SIGTERM.
        self._jobs: Optional[queue.SimpleQueue] = None
        self._workers: list[threading.Thread] = []
        self._stopping = False
        self._closed = False
        state = self.queue.read_state()
        self.windows: dict[str, float] = dict(state.get("windows", {}))
        # (subscription, job) -> [start of its window, messages sent in it]: the job limit.
        self.job_windows: dict[str, list] = {k: list(v) for k, v in state.get("job_windows", {}).items()}
        # A subscription stays disabled (410) only while its target is unchanged.
        self.disabled = {name: fp for name, fp in state.get("disabled", {}).items()
                         if name in self.subs and self.subs[name].target.fingerprint() == fp}
        self.held: dict[str, str] = {}
        for entry in sorted((e for e in self.queue.entries.values() if e.held), key=lambda e: e.seq):
            key = _key(entry.subscription, entry.job_id, entry.event_type)
            older = self.queue.entries.get(self.held.get(key, ""))
            if older is not None:
                # A crash between writing a window's newer message and finishing the one
                # it replaced: the newer one already counts the older among its suppressed.
                self.queue.finish([older])
            self.held[key] = entry.delivery_id

    # ---------------------------------------------------------- submit

    def submit(self, event: NotificationEvent) -> int:
        """Queue the event for every matching subscription; durable on return.
        Returns the number of deliveries queued (held ones included)."""
        records: list[DeliveryRecord] = []
        queued = 0
        with self._cond:
            if self._closed:
                raise RuntimeError("submit() on a closed notifier: its directory lock is released")
            now = self.clock()
            for sub in self.subs.values():
                if not sub.matches(event):
                    continue
                did = delivery_id(event.id, sub.name)
                if self.queue.known(did):
                    self.counters["duplicates"] += 1
                    continue
                self.counters["submitted"] += 1
                try:
                    record = self._admit(event, sub, did, now)
                except OSError as exc:  # a full or broken disk must not stop the caller's job
                    record = self._terminal(did, event, sub, S.DEAD, f"could not be queued: {exc}", now)
                if record is None:
                    queued += 1
                else:
                    records.append(record)
                    queued += record.status == S.SUPPRESSED.value
            self._cond.notify_all()
        self._log(records)
        return queued

    def submit_decision(self, decision: Decision, job_context: Optional[dict] = None) -> int:
        return sum(self.submit(event) for event in events_from_decision(decision, job_context))

    def _admit(self, event: NotificationEvent, sub: Subscription, did: str, now: float) -> Optional[DeliveryRecord]:
        if sub.name in self.disabled:
            return self._terminal(did, event, sub, S.DISABLED, "the endpoint answered 410 Gone before", now)
        key = _key(sub.name, event.job_id, event.type)
        start = self.windows.get(key)
        # A held entry not sent yet is replaced even if its window just ended:
        # it is still that window's one message, now carrying the newer event.
        old = self.queue.entries.get(self.held.get(key, ""))
        if old is not None and not old.held:
            old = None
        in_window = old is not None or (
            sub.rate_limit_s > 0 and start is not None and now < start + sub.rate_limit_s)
        job_full = self._job_full(sub, event.job_id, now)
        in_window = in_window or job_full is not None
        if old is None and self._full():
            return self._terminal(did, event, sub, S.DEAD, f"queue full ({len(self.queue.entries)} pending)", now)
        suppressed, since = (old.suppressed + 1, old.suppressed_since or old.time) if old else (0, 0.0)
        try:
            body = sub.template.render(event.payload(suppressed, since), sub.name)
        except RenderError as exc:
            return self._terminal(did, event, sub, S.DEAD, f"template error: {exc}", now)
        entry = Entry(seq=self._next_seq(), delivery_id=did, event_id=event.id, subscription=sub.name,
                      job_id=event.job_id, event_type=event.type, time=event.time, due=now, body=body,
                      held=in_window, suppressed=suppressed, suppressed_since=since)
        if in_window:
            if old is not None:
                entry.due = old.due
            else:  # held until both the type's window and the job's allow
                ends = [start + sub.rate_limit_s] if sub.rate_limit_s > 0 and start is not None else []
                entry.due = max(ends + ([job_full] if job_full is not None else []))
            self.queue.put(entry)
            if old is not None:
                self.queue.finish([old])  # its record already says suppressed; it stays so
                self._versions.pop(old.delivery_id, None)
            self.held[key] = did
            self.counters["suppressed"] += 1
            if job_full is not None:
                self.counters["job_suppressed"] += 1
            return self._record(_ref(did, event, sub), S.SUPPRESSED, now=now)
        self.queue.put(entry)
        opened = self._count_job(sub, event.job_id, now)
        if sub.rate_limit_s > 0:
            self.windows[key] = now
        if sub.rate_limit_s > 0 or opened:
            self._save_state(now)
        return None

    def _job_full(self, sub: Subscription, job_id: str, now: float) -> Optional[float]:
        """When the job's window ends, if the job has sent its most in it; else None."""
        limit = sub.job_limit
        window = self.job_windows.get(_key(sub.name, job_id, ""))
        if limit.interval_s <= 0 or window is None or now >= window[0] + limit.interval_s:
            return None
        return window[0] + limit.interval_s if window[1] >= limit.max_messages else None

    def _count_job(self, sub: Subscription, job_id: str, now: float) -> bool:
        """One more message of the job goes out; True when it opened a window."""
        if sub.job_limit.interval_s <= 0:
            return False
        key = _key(sub.name, job_id, "")
        window = self.job_windows.get(key)
        if window is not None and now < window[0] + sub.job_limit.interval_s:
            window[1] += 1
            return False
        self.job_windows[key] = [now, 1]
        return True

    def _terminal(self, did: str, event: NotificationEvent, sub: Subscription, status: DeliveryStatus,
                  error: str, now: float) -> DeliveryRecord:
        self.queue.mark_done([did])
        self.counters[status.value] += 1
        if status is S.DEAD:
            log.warning("notification %s to %s is dead: %s", event.type, sub.name, error)
        return self._record(_ref(did, event, sub), status, error=error, now=now)

    # --------------------------------------------------------- deliver

    def run_once(self) -> int:
        """One attempt for every subscription whose next delivery is due; returns attempts made."""
        with self._cond:
            picks, records = self._pick(self.clock())
        self._log(records)
        for entry in picks:
            self._work(entry)
        return len(picks)

    def start(self) -> None:
        """Deliver in a background thread until ``close()``."""
        if self._thread is None:
            self._jobs = queue.SimpleQueue()
            self._workers = [threading.Thread(target=self._worker, name=f"tw-notify-{i}", daemon=True)
                             for i in range(self.settings.workers)]
            for worker in self._workers:
                worker.start()
            self._thread = threading.Thread(target=self._loop, name="tw-notifier", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        failures = 0
        while True:
            try:
                if self._loop_once():
                    return
                failures = 0
            except Exception as exc:  # noqa: BLE001 - a full disk must not end delivery for good
                failures += 1
                self.counters["loop_errors"] += 1
                log.error("notifier loop error %d: %s", failures, type(exc).__name__)
                time.sleep(min(30.0, 0.5 * failures))

    def _loop_once(self) -> bool:
        """One round of picking and dispatching; True when the notifier is stopping."""
        with self._cond:
            if self._stopping:
                return True
            now = self.clock()
            picks, records = self._pick(now)
            if not picks and not records:
                wake = self._next_wake()
                self._cond.wait(1.0 if wake is None else min(max(wake - now, 0.002), 1.0))
                return False
        self._log(records)
        assert self._jobs is not None
        for entry in picks:
            self._jobs.put(entry)
        return False

    def _worker(self) -> None:
        assert self._jobs is not None
        while (entry := self._jobs.get()) is not None:
            self._work(entry)

    def _pick(self, now: float) -> tuple[list[Entry], list[DeliveryRecord]]:
        picks, records = [], []
        for name, entry in self.queue.heads(now)[0].items():
            if name in self._inflight:
                continue
            if name not in self.subs or name in self.disabled or not self.subs[name].enabled:
                gone = name not in self.subs
                why = ("the subscription no longer exists" if gone else
                       "the endpoint answered 410 Gone before" if name in self.disabled else
                       "the subscription is switched off (enabled: false)")
                records.append(self._finish(entry, S.DEAD if gone else S.DISABLED, Attempt("dead", error=why), now))
                continue
            if entry.due > now:
                continue
            if entry.held:  # its window ended: it is the window's message, and opens the next one
                key = _key(name, entry.job_id, entry.event_type)
                entry.held = False
                self.held.pop(key, None)
                self.windows[key] = now
                self._count_job(self.subs[name], entry.job_id, now)
                self._save_state(now)
            self._inflight.add(name)
            picks.append(entry)
        return picks, records

    def _next_wake(self) -> Optional[float]:
        """When the loop has something to do next: a head's due time, or a held
        entry's window end (it may become a head)."""
        heads, waiting = self.queue.heads(self.clock())
        dues = [e.due for name, e in heads.items() if name not in self._inflight] + [e.due for e in waiting]
        return min(dues) if dues else None

    def _work(self, entry: Entry) -> None:
        sub = self.subs[entry.subscription]
        try:
            result, secrets = self._attempt(sub, entry)
        except Exception as exc:  # noqa: BLE001 - a bug here must not wedge the subscription
            # Only the kind: an exception's text may quote a header or URL with a secret in it.
            log.error("notification attempt to %s failed inside trainwarden: %s", sub.name, type(exc).__name__)
            result, secrets = Attempt("dead", error=f"internal error ({type(exc).__name__})"), ()
        try:
            records = []
            with self._cond:
                if not self._closed:
                    records = self._apply(sub, entry, result, secrets)
            self._log(records)
        finally:
            # Only once its record is written: drain() and close() wait for
            # in-flight deliveries, and a daemon worker dies with the process.
            with self._cond:
                self._inflight.discard(entry.subscription)
                self._cond.notify_all()

    def _attempt(self, sub: Subscription, entry: Entry) -> tuple[Attempt, tuple[str, ...]]:
        return send_once(sub, entry.event_id, entry.body.encode(), env=self.env, allow_loopback=self.allow_loopback,
                         resolver=self.resolver, limit=self.settings.response_limit, clock=self.clock)

    def _apply(self, sub: Subscription, entry: Entry, result: Attempt, secrets: tuple) -> list[DeliveryRecord]:
        now = self.clock()
        result = dataclasses.replace(result, error=redact(result.error, secrets)[:1000])
        entry.attempts += 1
        if result.outcome == "delivered":
            return [self._finish(entry, S.DELIVERED, result, now)]
        if result.outcome == "disabled":
            self.disabled[sub.name] = sub.target.fingerprint()
            self._save_state(now)
            log.warning("subscription %s disabled: %s answered 410 Gone", sub.name, sub.target.shown_url())
            records = [self._finish(entry, S.DISABLED, result, now)]
            for other in [e for e in self.queue.entries.values() if e.subscription == sub.name]:
                records.append(self._finish(other, S.DISABLED, Attempt("disabled", error="the endpoint answered "
                                                                                          "410 Gone"), now))
            return records
        if result.outcome == "dead" or entry.attempts >= sub.retry.max_attempts:
            last = "" if result.outcome == "dead" else f" (attempt {entry.attempts} of {sub.retry.max_attempts})"
            log.warning("notification %s to %s is dead after %d attempt(s): %s", entry.event_type, sub.name,
                        entry.attempts, result.error)
            return [self._finish(entry, S.DEAD, dataclasses.replace(result, error=result.error + last), now)]
        entry.due = now + backoff(entry.attempts, sub.retry.backoff_s, sub.retry.max_backoff_s, self.rng,
                                  result.retry_after_s)
        entry.last_error, entry.last_status = result.error, result.http_status
        self.queue.put(entry)
        self.counters["retries"] += 1
        return [self._record(entry, S.RETRYING, result, now=now)]

    def _finish(self, entry: Entry, status: DeliveryStatus, result: Attempt, now: float) -> DeliveryRecord:
        if status is S.DEAD:
            entry.last_error, entry.last_status = result.error, result.http_status
        self.queue.finish([entry], dead=status is S.DEAD)
        self.held.pop(_key(entry.subscription, entry.job_id, entry.event_type), None) if entry.held else None
        self.counters[status.value] += 1
        return self._record(entry, status, result, now=now)

    # ------------------------------------------------------- lifecycle

    def pending(self) -> int:
        with self._cond:
            return len(self.queue.entries)

    def drain(self, timeout_s: float, release_held: bool = False) -> bool:
        """Wait until nothing is pending; True if so. ``release_held`` sends held
        rate-limit messages now (for a one-shot run about to exit). Without
        ``start()`` it delivers in the calling thread."""
        deadline = time.monotonic() + timeout_s
        if release_held:
            with self._cond:
                for entry in self.queue.entries.values():
                    if entry.held:
                        entry.due = min(entry.due, self.clock())
                self._cond.notify_all()
        while True:
            with self._cond:
                if not self.queue.entries and not self._inflight:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not self._inflight and not any(e.due <= self.clock() + remaining
                                                  for e in self.queue.entries.values()):
                    # Nothing can go out before the deadline (a held message, a
                    # retry in backoff): waiting for it would only delay a stop.
                    return False
                if self._thread is not None:
                    self._cond.wait(min(remaining, 0.05))
                    continue
                wake = self._next_wake()
            if not self.run_once():
                time.sleep(min(max((wake or 0) - self.clock(), 0.002), remaining, 0.05))

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop delivering; what is pending stays on disk for the next notifier.
        An attempt still under way after ``timeout_s`` is left to its daemon
        thread (a service has 5 s from SIGTERM to exit)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._jobs is not None:
            # Picked but not started: they stay pending on disk for the next notifier.
            while True:
                try:
                    entry = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if entry is not None:
                    with self._cond:
                        self._inflight.discard(entry.subscription)
            for _ in self._workers:
                self._jobs.put(None)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._inflight and time.monotonic() < deadline:
                self._cond.wait(0.05)
            # An attempt still running is forgotten: its entry stays pending and
            # is sent again next time (same webhook-id, receivers dedupe).
            self._closed = True
        self.queue.close()
        close = getattr(self.writer, "close", None)
        if callable(close):
            close()

    def stats(self) -> dict:
        with self._cond:
            return {**self.counters, "pending": len(self.queue.entries), "in_flight": len(self._inflight),
                    "disabled_subscriptions": sorted(self.disabled)}

    # --------------------------------------------------------- helpers

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _full(self) -> bool:
        return (len(self.queue.entries) >= self.settings.max_pending
                or self.queue.bytes >= self.settings.max_pending_bytes)

    def _save_state(self, now: float) -> None:
        horizon = max((s.rate_limit_s for s in self.subs.values()), default=0.0)
        self.windows = {k: v for k, v in self.windows.items() if v + horizon > now}
        job_horizon = max((s.job_limit.interval_s for s in self.subs.values()), default=0.0)
        self.job_windows = {k: v for k, v in self.job_windows.items() if v[0] + job_horizon > now}
        self.queue.write_state({"windows": self.windows, "job_windows": self.job_windows, "disabled": self.disabled})

    def _record(self, item: Entry, status: DeliveryStatus, result: Optional[Attempt] = None,
                error: str = "", now: float = 0.0) -> DeliveryRecord:
        did = item.delivery_id
        # The newest version of a delivery wins in the log: versions must be ordered.
        updated = max(now or self.clock(), self._versions.get(did, 0.0) + 0.001)
        if status in (S.RETRYING, S.SUPPRESSED):
            self._versions[did] = updated
        else:  # final: no later version will follow
            self._versions.pop(did, None)
        return DeliveryRecord(delivery_id=did, event_id=item.event_id, subscription=item.subscription,
                              job_id=item.job_id, event_type=item.event_type, time=item.time, attempts=item.attempts,
                              status=status.value, http_status=result.http_status if result else 0,
                              latency_ms=result.latency_ms if result else 0.0,
                              error=(result.error if result else error)[:1000], updated_at=updated)

    def _log(self, records: list[DeliveryRecord]) -> None:
        if not records:
            return
        try:
            with self._log_lock:
                self.writer.write(records)
        except Exception as exc:  # noqa: BLE001 - the log is secondary to delivering
            self.counters["log_errors"] += 1
            log.warning("delivery log write failed: %r", exc)


def _key(subscription: str, job_id: str, event_type: str) -> str:
    return f"{subscription}\x1f{job_id}\x1f{event_type}"



def _ref(did: str, event: NotificationEvent, sub: Subscription) -> Entry:
    """What a record needs, for an event that never became a queue entry."""
    return Entry(seq=0, delivery_id=did, event_id=event.id, subscription=sub.name, job_id=event.job_id,
                 event_type=event.type, time=event.time, due=0.0, body="")
