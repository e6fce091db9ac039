"""An in-process bus with Kafka's semantics where they matter to us: keyed
partitions (one key, one partition, in order), consumer groups that share
partitions (the same partition number of every topic to the same member, like
Kafka's range assignor), and committed offsets that a new member resumes from.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Callable, Optional, Sequence

from trainwarden.bus.base import BusError, Message, TopicSpec

DEFAULT_PARTITIONS = 4


class MemoryBus:
    def __init__(self, default_partitions: int = DEFAULT_PARTITIONS):
        self.default_partitions = default_partitions
        self._topics: dict[str, list[list[Message]]] = {}
        self._committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> next offset
        self._members: dict[str, list["MemoryConsumer"]] = {}
        self._cond = threading.Condition()

    # ------------------------------------------------------------ topics

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        created = []
        with self._cond:
            for spec in specs:
                if spec.name not in self._topics:
                    self._topics[spec.name] = [[] for _ in range(max(1, spec.partitions))]
                    created.append(spec.name)
        return created

    def _partitions(self, topic: str) -> list[list[Message]]:
        if topic not in self._topics:
            self._topics[topic] = [[] for _ in range(self.default_partitions)]
        return self._topics[topic]

    def append(self, topic: str, key: str, value: bytes) -> None:
        with self._cond:
            partitions = self._partitions(topic)
            index = zlib.crc32(key.encode()) % len(partitions)
            log = partitions[index]
            log.append(Message(topic, key, value, index, len(log), int(time.time() * 1000)))
            self._cond.notify_all()

    def producer(self) -> "MemoryProducer":
        return MemoryProducer(self)

    def consumer(self, topics: Sequence[str], group: Optional[str], from_beginning: bool = False,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]] = None,
                 fetch_wait_s: Optional[float] = None) -> "MemoryConsumer":
        # No fetches in memory: a poll is woken by a send (fetch_wait_s is moot).
        consumer = MemoryConsumer(self, list(topics), group, from_beginning, on_assign)
        with self._cond:
            for topic in topics:
                self._partitions(topic)
            if group is None:
                consumer._assign([(t, p) for t in topics for p in range(len(self._topics[t]))])
            else:
                self._members.setdefault(group, []).append(consumer)
                self._rebalance(group)
        return consumer

    # ----------------------------------------------------------- groups

    def _rebalance(self, group: str) -> None:
        members = self._members.get(group, [])
        for index, member in enumerate(members):
            owned = [(t, p) for t in member.topics for p in range(len(self._topics[t]))
                     if p % len(members) == index]
            member._assign(owned)

    def _leave(self, consumer: "MemoryConsumer") -> None:
        with self._cond:
            members = self._members.get(consumer.group or "", [])
            if consumer in members:
                members.remove(consumer)
                self._rebalance(consumer.group)

    def committed(self, group: str, topic: str, partition: int) -> Optional[int]:
        return self._committed.get((group, topic, partition))

    def end_offsets(self, topic: str) -> list[int]:
        with self._cond:
            return [len(log) for log in self._partitions(topic)]

    def close(self) -> None:
        with self._cond:
            self._cond.notify_all()


class MemoryProducer:
    def __init__(self, bus: MemoryBus):
        self.bus = bus
        self.closed = False

    def send(self, topic: str, key: str, value: bytes) -> None:
        if self.closed:
            raise BusError("the producer is closed")
        self.bus.append(topic, key, value)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Appends are synchronous: nothing is ever in flight."""

    def close(self) -> None:
        self.closed = True


class MemoryConsumer:
    def __init__(self, bus: MemoryBus, topics: list[str], group: Optional[str], from_beginning: bool,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]]):
        self.bus = bus
        self.topics = topics
        self.group = group
        self.from_beginning = from_beginning
        self.on_assign = on_assign
        self._positions: dict[tuple[str, int], int] = {}
        self._pending_assign: Optional[list[tuple[str, int]]] = None
        self.closed = False

    def _assign(self, partitions: list[tuple[str, int]]) -> None:
        # Called with the bus lock held: positions restart from the group's commits.
        positions = {}
        for topic, partition in partitions:
            committed = self.bus._committed.get((self.group, topic, partition)) if self.group else None
            if committed is not None:
                positions[(topic, partition)] = committed
            elif self.from_beginning:
                positions[(topic, partition)] = 0
            else:
                positions[(topic, partition)] = len(self.bus._topics[topic][partition])
        self._positions = positions
        self._pending_assign = list(partitions)

    def assignment(self) -> list[tuple[str, int]]:
        return list(self._positions)

    def ready(self) -> bool:
        return bool(self._positions)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        with self.bus._cond:
            while True:
                if self._pending_assign is not None and self.on_assign is not None:
                    assigned, self._pending_assign = self._pending_assign, None
                    self.bus._cond.release()
                    try:
                        self.on_assign(assigned)
                    finally:
                        self.bus._cond.acquire()
                records = self._take(max_records)
                remaining = deadline - time.monotonic()
                if records or remaining <= 0 or self.closed:
                    return records
                self.bus._cond.wait(remaining)

    def _take(self, max_records: int) -> list[Message]:
        records: list[Message] = []
        for key, position in self._positions.items():
            log = self.bus._topics[key[0]][key[1]]
            if position < len(log):
                chunk = log[position: position + max_records - len(records)]
                records.extend(chunk)
                self._positions[key] = position + len(chunk)
                if len(records) >= max_records:
                    break
        return records

    def seek_to_beginning(self, partitions: Sequence[tuple[str, int]]) -> None:
        with self.bus._cond:
            for key in partitions:
                if key in self._positions:
                    self._positions[key] = 0

    def end_offset(self, topic: str, partition: int) -> int:
        with self.bus._cond:
            return len(self.bus._topics[topic][partition])

    def positions(self) -> dict[tuple[str, int], int]:
        with self.bus._cond:
            return dict(self._positions)

    def lags(self) -> dict[tuple[str, int], int]:
        with self.bus._cond:
            return {key: max(0, len(self.bus._topics[key[0]][key[1]]) - position)
                    for key, position in self._positions.items()}

    def commit(self) -> None:
        if self.group is None:
            return
        with self.bus._cond:
            for (topic, partition), position in self._positions.items():
                self.bus._committed[(self.group, topic, partition)] = position

    def close(self) -> None:
        self.closed = True
        if self.group is not None:
            self.bus._leave(self)
