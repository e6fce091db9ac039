"""An agent's commands, read from the bus on a thread of their own.

A Kafka consumer costs about 2 ms of CPU per ``poll`` call, whether or not
anything came (kafka-python's coordinator, fetcher and timers). The agent's
loop turns 20 times a second to hand out its instances' output, so polling
there cost 4% of a core per idle agent: 0.6 of this machine's 2 cores for
16 agents doing nothing, taken from the instances and the restarts
(docs/PERFORMANCE.md). Here the consumer waits for commands in long polls,
and the loop only looks at its inbox.

Lockstep, so that nothing is committed before it is carried out: the feed
hands a batch to the loop (``deliver``), waits until the loop says it is
handled, commits, then polls again. A bus error is kept (``error``) until a
poll gets through again; the loop raises it, so the service says the outage
as it says any other.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from trainwarden.bus import BusError

# A long poll returns as soon as a command arrives; this bounds only how
# long closing the feed can wait for it.
POLL_S = 0.5
RETRY_S = 1.0


class CommandBatch:
    """Commands read together, in order; ``handled()`` once carried out."""

    def __init__(self, records: list):
        self.records = records
        self._handled = threading.Event()

    def handled(self) -> None:
        self._handled.set()

    def wait(self, timeout_s: float) -> bool:
        return self._handled.wait(timeout_s)


class CommandFeed:
    def __init__(self, consumer, deliver: Callable[[CommandBatch], None],
                 on_ready: Callable[[], Optional[dict]]):
        """``on_ready()`` runs on the feed's thread once the consumer is
        assigned with every position known (``consumer.ready()``); what it
        returns is kept as ``joined`` (commands read before are delivered
        too, with ``joined`` still None)."""
        self.consumer = consumer
        self._deliver = deliver
        self._on_ready = on_ready
        self.joined: Optional[dict] = None
        self.is_ready = False
        # Every command read before ``joined`` carried out (a run that
        # continues its predecessor heartbeats only then: services/agent.py).
        self.caught_up = False
        self.error: Optional[BusError] = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="command-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._once()
            except BusError as exc:
                self.error = exc
                self._closing.wait(RETRY_S)
            except Exception as exc:  # noqa: BLE001 - the feed must outlive one bad poll, as the loop does
                self.error = BusError(f"reading the commands failed: {exc!r}.")
                self._closing.wait(RETRY_S)

    def _once(self) -> None:
        # Short polls until ready: joining the group takes a few, and
        # readiness is looked at between them.
        records = self.consumer.poll(POLL_S if self.is_ready else 0.05, max_records=100)
        self.error = None  # the bus answered
        if records:
            batch = CommandBatch(records)
            self._deliver(batch)
            while not batch.wait(0.1):
                if self._closing.is_set():
                    return  # not handled: not committed
            self.consumer.commit()
        if not self.is_ready and self.consumer.ready():
            self.joined = self._on_ready()
            self.is_ready = True
        if self.is_ready and not self.caught_up:
            # Lockstep: whatever was read is handled by now.
            positions = self.consumer.positions()
            self.caught_up = all(positions.get(tp, 0) >= end for tp, end in (self.joined or {}).items())

    def close(self) -> None:
        """Stop reading (the caller closes the consumer afterwards)."""
        self._closing.set()
        # Not waited for longer: a position lookup during a broker outage
        # may take 10 s, and the agent must be gone within 5 s of its
        # SIGTERM. The thread then ends on the closed consumer (a daemon).
        self._thread.join(POLL_S + 1.0)
