"""The bus: topics of keyed messages, producers, consumer groups.

Two implementations behind these Protocols: ``memory`` (in-process, for the
embedded mode and tests) and ``kafka`` (kafka-python). A message's key is the
job id (or the node for commands and heartbeats), so one job's messages stay
in order in one partition.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Optional, Protocol, Sequence

# Every topic and consumer group name starts with this prefix, so several
# Trainwarden installations (or test runs) can share one broker.
PREFIX = os.environ.get("TRAINWARDEN_TOPIC_PREFIX", "trainwarden")
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,100}", PREFIX):
    raise SystemExit(f"trainwarden: error: TRAINWARDEN_TOPIC_PREFIX {PREFIX!r} must be letters, digits, '_' or '-'.")

LOGS = f"{PREFIX}.logs"
EVENTS = f"{PREFIX}.events"
DECISIONS = f"{PREFIX}.decisions"
COMMANDS = f"{PREFIX}.commands"
NODES = f"{PREFIX}.nodes"  # agent heartbeats, keyed by node
ACTUATOR_STATE = f"{PREFIX}.actuator"  # compacted: executed actions, node states
DEAD_LETTERS = f"{PREFIX}.deadletter"
MARKET = f"{PREFIX}.market"  # compacted: the market service's quotes, keyed by market, read in full by every processor
ALL_TOPICS = (LOGS, EVENTS, DECISIONS, COMMANDS, NODES, ACTUATOR_STATE, DEAD_LETTERS, MARKET)
COMPACTED_TOPICS = (ACTUATOR_STATE, MARKET)


@dataclasses.dataclass(frozen=True)
class Message:
    topic: str
    key: str
    value: bytes
    partition: int = 0
    offset: int = -1
    timestamp_ms: int = 0
    # When the broker appended it, on the broker's clock, if the topic records
    # that (message.timestamp.type=LogAppendTime, set by `kafka init`); else 0.
    # No producer can set it: bus/signing.py judges a message's age by it.
    append_ms: int = 0


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    compacted: bool = False


class BusError(Exception):
    """The bus cannot be reached or refused an operation; one sentence and a hint."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class Producer(Protocol):
    def send(self, topic: str, key: str, value: bytes) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    def close(self) -> None: ...


class Consumer(Protocol):
    def poll(self, timeout_s: float, max_records: int = 500) -> list[Message]: ...

    def commit(self) -> None:
        """Commit the offsets of every message returned by poll so far: call it
        only once their effect is durable (at-least-once)."""

    def assignment(self) -> list[tuple[str, int]]: ...

    def ready(self) -> bool:
        """Partitions assigned and positions resolved: from now on nothing is missed."""

    def seek_to_beginning(self, partitions: Sequence[tuple[str, int]]) -> None: ...

    def end_offset(self, topic: str, partition: int) -> int: ...

    def positions(self) -> dict[tuple[str, int], int]:
        """The offset of the next message poll returns, per assigned partition
        whose position is known (no request to the broker)."""

    def lags(self) -> dict[tuple[str, int], int]:
        """Messages behind the end, per assigned partition, from what the
        client already knows (no request to the broker): cheap enough for
        every scrape. A partition whose end is not known yet is left out."""

    def close(self) -> None: ...


class Bus(Protocol):
    def producer(self) -> Producer: ...

    def consumer(self, topics: Sequence[str], group: Optional[str], from_beginning: bool = False,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]] = None,
                 fetch_wait_s: Optional[float] = None) -> Consumer:
        """``fetch_wait_s``: how long one fetch waits at the broker while
        nothing comes (None: the bus's default). Data ends the wait at once,
        so this sets only how often an idle consumer asks: a consumer that is
        idle most of the time and many (the agents' commands) asks rarely."""

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]: ...

    def close(self) -> None: ...


def read_to_end(consumer: Consumer, timeout_s: float = 60.0) -> list[Message]:
    """Everything a (group-less, from-the-beginning) consumer's partitions held
    when called. An empty poll proves nothing (the client may not have fetched
    yet), so this reads until each partition's end offset is reached."""
    import time

    deadline = time.monotonic() + timeout_s
    while not consumer.ready():
        if time.monotonic() > deadline:
            raise BusError("the bus did not assign partitions in time.")
        consumer.poll(0.1)
    ends = {tp: consumer.end_offset(*tp) for tp in consumer.assignment()}
    seen = {tp: -1 for tp in ends}
    records: list[Message] = []
    while any(seen[tp] < end - 1 for tp, end in ends.items()):
        if time.monotonic() > deadline:
            raise BusError("reading the bus to its end took too long.")
        for record in consumer.poll(0.5, max_records=5000):
            records.append(record)
            key = (record.topic, record.partition)
            seen[key] = max(seen.get(key, -1), record.offset)
        # A consumer that drops what it refuses (bus/signing.py) says how far
        # it read: a refused last record must not look like one still to come.
        for key, offset in getattr(consumer, "offsets_read", {}).items():
            seen[key] = max(seen.get(key, -1), offset)
    return records
