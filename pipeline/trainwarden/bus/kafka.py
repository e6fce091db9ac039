"""The bus on Apache Kafka, through kafka-python.

Producers wait for every in-sync replica (acks=all), compress with gzip (in
the standard library, so no extra codec package is needed) and batch for a
few milliseconds. Consumers never auto-commit: a service commits once the
effect of what it polled is durable. The client reconnects by itself when the
broker comes back; calls that cannot finish raise BusError.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional, Sequence

from trainwarden.bus.base import BusError, Message, TopicSpec

MAX_REQUEST_BYTES = 16 * 1024 * 1024

# kafka-python logs every reconnect attempt as an error; the services report
# the state of the bus themselves. TRAINWARDEN_KAFKA_DEBUG=FILE writes the
# client's own debug log to FILE, for diagnosing group coordination.
if os.environ.get("TRAINWARDEN_KAFKA_DEBUG"):
    _handler = logging.FileHandler(os.environ["TRAINWARDEN_KAFKA_DEBUG"])
    _handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("kafka").addHandler(_handler)
    logging.getLogger("kafka").setLevel(logging.DEBUG)
else:
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def _kafka():
    # Imported on first use: `pip install trainwarden` (run and the SDK) has no Kafka client.
    try:
        import kafka
    except ImportError:
        raise BusError("the cluster commands need the kafka-python client, which is not installed.",
                       hint="pip install 'trainwarden[kafka]'") from None
    return kafka


class KafkaBus:
    def __init__(self, bootstrap: str, client_id: str = "trainwarden"):
        self.bootstrap = bootstrap
        self.client_id = client_id

    def _errors(self):
        return _kafka().errors

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        kafka = _kafka()
        from kafka.admin import NewTopic

        try:
            admin = kafka.KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=self.client_id,
                                           request_timeout_ms=15000)
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.",
                           hint="start it (deploy/kafka/local-kafka start) or pass --bootstrap HOST:PORT") from None
        try:
            existing = set(admin.list_topics())
            wanted = [NewTopic(s.name, s.partitions, 1,
                               topic_configs={"cleanup.policy": "compact"} if s.compacted else {})
                      for s in specs if s.name not in existing]
            if wanted:
                try:
                    admin.create_topics(wanted, timeout_ms=15000)
                except kafka.errors.TopicAlreadyExistsError:
                    pass
            return [t.name for t in wanted]
        finally:
            admin.close()

    def producer(self) -> "KafkaProducerAdapter":
        kafka = _kafka()
        try:
            producer = kafka.KafkaProducer(
                bootstrap_servers=self.bootstrap, client_id=self.client_id, acks="all",
                compression_type="gzip", linger_ms=5, max_request_size=MAX_REQUEST_BYTES,
                retries=2147483647, max_block_ms=30000, request_timeout_ms=15000,
            )
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.",
                           hint="start it (deploy/kafka/local-kafka start) or pass --bootstrap HOST:PORT") from None
        return KafkaProducerAdapter(producer, kafka.errors)

    def consumer(self, topics: Sequence[str], group: Optional[str], from_beginning: bool = False,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]] = None) -> "KafkaConsumerAdapter":
        kafka = _kafka()
        try:
            consumer = kafka.KafkaConsumer(
                bootstrap_servers=self.bootstrap, client_id=self.client_id, group_id=group,
                enable_auto_commit=False, auto_offset_reset="earliest" if from_beginning else "latest",
                max_partition_fetch_bytes=MAX_REQUEST_BYTES, fetch_max_bytes=4 * MAX_REQUEST_BYTES,
                session_timeout_ms=10000, heartbeat_interval_ms=1000, max_poll_interval_ms=300000,
                request_timeout_ms=30500,
                # A fetch waits at most this long for data: the bound on how
                # late a decision can be picked up at each hop (default 500 ms).
                fetch_max_wait_ms=100,
            )
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.",
                           hint="start it (deploy/kafka/local-kafka start) or pass --bootstrap HOST:PORT") from None
        adapter = KafkaConsumerAdapter(consumer, kafka, on_assign)
        # Load the topics' metadata before joining a group: a group leader that
        # assigns without it hands out nothing, and keeps doing so until its
        # next metadata refresh (minutes later).
        known = {}
        for topic in topics:
            known[topic] = consumer.partitions_for_topic(topic)
            if not known[topic]:
                consumer.close()
                raise BusError(f"the Kafka topic {topic} does not exist.",
                               hint="create the topics with: trainwarden kafka init")
        if group is None:
            partitions = []
            for topic in topics:
                for partition in sorted(known[topic]):
                    partitions.append(kafka.TopicPartition(topic, partition))
            consumer.assign(partitions)
            if from_beginning:
                consumer.seek_to_beginning(*partitions)
            else:
                consumer.seek_to_end(*partitions)
            adapter._notify([(p.topic, p.partition) for p in partitions])
        else:
            consumer.subscribe(list(topics), listener=adapter.listener())
        return adapter

    def close(self) -> None:
        """Clients own their connections; nothing is shared."""


class KafkaProducerAdapter:
    def __init__(self, producer, errors):
        self._producer = producer
        self._errors = errors

    def send(self, topic: str, key: str, value: bytes) -> None:
        try:
            self._producer.send(topic, key=key.encode("utf-8"), value=value)
        except self._errors.KafkaError as exc:
            raise BusError(f"Kafka refused a message for {topic}: {exc}.") from None

    def flush(self, timeout_s: float = 30.0) -> None:
        try:
            self._producer.flush(timeout=timeout_s)
        except self._errors.KafkaError as exc:
            raise BusError(f"Kafka did not acknowledge the messages in {timeout_s:.0f} s: {exc}.") from None

    def close(self) -> None:
        try:
            self._producer.close(timeout=5)
        except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
            pass


class KafkaConsumerAdapter:
    def __init__(self, consumer, kafka, on_assign):
        self._consumer = consumer
        self._kafka = kafka
        self._on_assign = on_assign
        self.skipped_commits = 0

    def listener(self):
        adapter = self

        class Listener(self._kafka.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                pass

            def on_partitions_assigned(self, assigned):
                adapter._notify([(tp.topic, tp.partition) for tp in assigned])

        return Listener()

    def _notify(self, partitions: list[tuple[str, int]]) -> None:
        if self._on_assign is not None:
            self._on_assign(partitions)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Message]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except self._kafka.errors.KafkaError as exc:
            raise BusError(f"polling Kafka failed: {exc}.") from None
        records = []
        for tp, items in batches.items():
            for r in items:
                key = r.key.decode("utf-8", errors="replace") if r.key is not None else ""
                records.append(Message(tp.topic, key, r.value, tp.partition, r.offset, r.timestamp))
        return records

    def assignment(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def ready(self) -> bool:
        """Assigned, and every position known: "latest" is looked up lazily by
        the client, and a message produced before that lookup would be skipped."""
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        try:
            positions = {tp: self._consumer.position(tp, timeout_ms=10000) for tp in assigned}
            if self._consumer.config.get("group_id"):
                # Pin them: after a later rebalance a partition without a
                # committed offset would reset to "latest" again and skip
                # whatever was produced in between.
                from kafka.structs import OffsetAndMetadata

                self._consumer.commit({tp: OffsetAndMetadata(offset, "", -1) for tp, offset in positions.items()})
        except self._kafka.errors.KafkaError:
            return False
        return True

    def seek_to_beginning(self, partitions: Sequence[tuple[str, int]]) -> None:
        tps = [self._kafka.TopicPartition(t, p) for t, p in partitions]
        if tps:
            self._consumer.seek_to_beginning(*tps)

    def end_offset(self, topic: str, partition: int) -> int:
        tp = self._kafka.TopicPartition(topic, partition)
        try:
            return self._consumer.end_offsets([tp])[tp]
        except self._kafka.errors.KafkaError as exc:
            raise BusError(f"reading the end offset of {topic}/{partition} failed: {exc}.") from None

    def commit(self) -> None:
        errors = self._kafka.errors
        try:
            self._consumer.commit()
        except (errors.CommitFailedError, errors.RebalanceInProgressError, errors.IllegalGenerationError,
                errors.UnknownMemberIdError):
            # The group is rebalancing: the next poll completes it and the next
            # commit covers these offsets; a message handled twice meanwhile is
            # absorbed by the idempotent consumers. Not an outage of the bus.
            self.skipped_commits += 1
        except errors.KafkaError as exc:
            raise BusError(f"committing offsets failed: {exc}.") from None

    def close(self) -> None:
        try:
            self._consumer.close(autocommit=False)
        except Exception:  # noqa: BLE001
            pass
