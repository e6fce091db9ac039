"""The bus on Apache Kafka, through kafka-python.

Producers wait for every in-sync replica (acks=all), compress with gzip (in
the standard library, so no extra codec package is needed) and batch for a
few milliseconds. Consumers never auto-commit: a service commits once the
effect of what it polled is durable. The client reconnects by itself when the
broker comes back; calls that cannot finish raise BusError.

Every client gets the TLS and SASL settings of ``KafkaSecurity`` (read from
the environment). Before the first client, one connection checks the login,
so that a refused password, an untrusted certificate or a listener that
speaks another protocol is a clear BusError at once, not a client retrying
for ever; a message the broker refuses (an ACL) fails the next flush.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import threading
import time
from typing import Callable, Optional, Sequence

from trainwarden.bus.base import BusError, Message, TopicSpec
from trainwarden.bus.kafka_security import KafkaSecurity, source

MAX_REQUEST_BYTES = 16 * 1024 * 1024
# How long a fetch waits at the broker while nothing comes (Kafka's default is
# 500 ms). Data ends the wait at once, whatever this is; what it sets is how
# soon a fetch for partitions newly assigned (a takeover) can go out behind
# one waiting, and how often an idle consumer asks: ten times a second here.
FETCH_WAIT_MS = 100
# A partition's messages go in batches of up to this size (the client's
# default is 16 KiB): a 1,024-wide restart's start commands, about 1.5 KiB
# each, took 1.5 s to reach the broker in 16 KiB batches, five in flight.
BATCH_BYTES = 1024 * 1024
# Every topic records when the broker appended each message (one clock, which
# no producer sets): bus/signing.py judges a signed message's age by it.
APPEND_TIME_KEY = "message.timestamp.type"
APPEND_TIME = {APPEND_TIME_KEY: "LogAppendTime"}
# The login check's bound: a broker that has not answered by then is treated
# as unreachable (the clients then wait it out as they always do).
LOGIN_CHECK_S = 10.0
_log = logging.getLogger("trainwarden.kafka")
UNREACHABLE_HINT = "start it (deploy/kafka/local-kafka start) or pass --bootstrap HOST:PORT"
# A consumer group member killed without leaving (SIGKILL, a lost host) keeps
# its partitions until its session expires: the session bounds how soon a
# surviving processor, or a restarted actuator or agent, takes over
# (docs/OPERATIONS.md, "Takeover"). 2 s needs a broker whose
# group.min.session.timeout.ms allows it (deploy/kafka/server.properties);
# a stock broker's minimum is 6 s, to which the default falls back.
SESSION_ENV = "TRAINWARDEN_KAFKA_SESSION_TIMEOUT_MS"
SESSION_TIMEOUT_MS = 2000
STOCK_MIN_SESSION_MS = 6000
SESSION_BOUNDS_MS = (1000, 300000)


# A client retries a lost broker with a backoff that doubles up to this (the
# client's default is 30 s): after an outage every service is back within a
# second of the broker, not at its next attempt up to 30 s later.
RECONNECT_BACKOFF_MAX_MS = 1000


def session_timeout_ms(environ=None) -> tuple[int, bool]:
    """The consumers' session timeout and whether the operator chose it
    (``SESSION_ENV``); BusError naming the variable when it is not a whole
    number of milliseconds within ``SESSION_BOUNDS_MS``."""
    raw = (os.environ if environ is None else environ).get(SESSION_ENV, "").strip()
    if not raw:
        return SESSION_TIMEOUT_MS, False
    low, high = SESSION_BOUNDS_MS
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise BusError(f"{SESSION_ENV}={raw[:40]!r} is not a whole number of milliseconds from {low} to {high}.",
                       hint=f"unset it for the default ({SESSION_TIMEOUT_MS} ms), or give e.g. {STOCK_MIN_SESSION_MS} "
                            "for a broker that keeps the stock group.min.session.timeout.ms")
    return int(raw), True


def heartbeat_interval_ms(session_ms: int) -> int:
    """A quarter of the session, at most 1 s: a survivor hears of a rebalance
    at its next heartbeat, and a session survives three lost ones."""
    return max(100, min(1000, session_ms // 4))

# kafka-python logs every reconnect attempt as an error; the services report
# the state of the bus themselves. TRAINWARDEN_KAFKA_DEBUG=FILE writes the
# client's own debug log to FILE, for diagnosing group coordination.
class _RedactPasswords(logging.Filter):
    """kafka-python logs its whole configuration at debug level, passwords included."""

    _PASSWORD = re.compile(r"""(['"]?(?:sasl_plain_password|ssl_password)['"]?\s*[:=]\s*)(['"]).*?\2""")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        redacted = self._PASSWORD.sub(r"\1\2***\2", text)
        if redacted != text:
            record.msg, record.args = redacted, ()
        return True


if os.environ.get("TRAINWARDEN_KAFKA_DEBUG"):
    _handler = logging.FileHandler(os.environ["TRAINWARDEN_KAFKA_DEBUG"])
    _handler.addFilter(_RedactPasswords())
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
    def __init__(self, bootstrap: str, client_id: str = "trainwarden", security: Optional[KafkaSecurity] = None):
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.security = security if security is not None else KafkaSecurity.from_env()
        self.session_ms, self._session_chosen = session_timeout_ms()
        self._login_checked = False

    def __repr__(self) -> str:
        return f"KafkaBus({self.bootstrap!r}, {self.security.describe()})"

    def _options(self) -> dict:
        self._check_login()
        return dict(bootstrap_servers=self.bootstrap, client_id=self.client_id,
                    reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS, **self.security.client_options())

    def _check_login(self) -> None:
        if self._login_checked:
            return
        for server in self.bootstrap.split(","):
            if check_login(server.strip(), self.security, self.client_id):
                self._login_checked = True
                return

    def _errors(self):
        return _kafka().errors

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        kafka = _kafka()
        from kafka.admin import NewTopic

        try:
            admin = kafka.KafkaAdminClient(**self._options(), request_timeout_ms=15000)
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.", hint=UNREACHABLE_HINT) from None
        try:
            existing = set(admin.list_topics())
            wanted = [NewTopic(s.name, s.partitions, 1,
                               topic_configs={**APPEND_TIME, **({"cleanup.policy": "compact"} if s.compacted else {})})
                      for s in specs if s.name not in existing]
            if wanted:
                try:
                    admin.create_topics(wanted, timeout_ms=15000)
                except kafka.errors.TopicAlreadyExistsError:
                    pass
                except kafka.errors.AuthorizationError as exc:
                    raise BusError(f"Kafka at {self.bootstrap} does not let {self._who()} create the topics "
                                   f"{', '.join(t.name for t in wanted)} ({type(exc).__name__}).",
                                   hint="run `trainwarden kafka init` with credentials allowed to create them "
                                        "(an ACL for Create on the topics), or create them as an admin") from None
            self._record_append_time(admin, [s.name for s in specs if s.name in existing])
            return [t.name for t in wanted]
        finally:
            admin.close()

    def _record_append_time(self, admin, topics: list[str]) -> None:
        """Topics made by an older `kafka init` record the producer's time: set
        the broker's append time on them too, keeping their other settings
        (the legacy AlterConfigs replaces a topic's whole configuration)."""
        from kafka.admin import ConfigResource, ConfigResourceType

        if not topics:
            return
        errors = _kafka().errors
        try:
            described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
            changes = []
            for response in described:
                for error_code, _, _, name, entries in response.resources:
                    if error_code:
                        raise errors.for_code(error_code)(name)
                    # (name, value, read_only, source, sensitive, ...); source 1: set on this topic.
                    own = {e[0]: e[1] for e in entries if e[3] == 1 and not e[4]}
                    if own.get(APPEND_TIME_KEY) != APPEND_TIME[APPEND_TIME_KEY]:
                        changes.append(ConfigResource(ConfigResourceType.TOPIC, name, configs={**own, **APPEND_TIME}))
            if changes:
                for error_code, error_message, _, name in admin.alter_configs(changes).resources:
                    if error_code:
                        raise errors.for_code(error_code)(f"{name}: {error_message or ''}")
        except errors.KafkaError as exc:
            _log.warning("the Kafka topics %s may still record the producers' time, not the broker's append time "
                         "(%s): a signed message's age is then judged on each consumer's clock. Fix: let %s alter "
                         "the topics' configuration and run `trainwarden kafka init` again, or set "
                         "message.timestamp.type=LogAppendTime on them (kafka-configs.sh --alter --add-config)",
                         ", ".join(topics), type(exc).__name__, self._who())

    def producer(self) -> "KafkaProducerAdapter":
        kafka = _kafka()
        try:
            producer = kafka.KafkaProducer(
                **self._options(), acks="all",
                compression_type="gzip", linger_ms=5, batch_size=BATCH_BYTES, max_request_size=MAX_REQUEST_BYTES,
                retries=2147483647, max_block_ms=30000, request_timeout_ms=15000,
            )
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.", hint=UNREACHABLE_HINT) from None
        return KafkaProducerAdapter(producer, kafka.errors, self._who())

    def consumer(self, topics: Sequence[str], group: Optional[str], from_beginning: bool = False,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]] = None,
                 fetch_wait_s: Optional[float] = None) -> "KafkaConsumerAdapter":
        kafka = _kafka()
        adapter = KafkaConsumerAdapter(None, kafka, on_assign, self._who())
        wait_ms = FETCH_WAIT_MS if fetch_wait_s is None else max(1, round(fetch_wait_s * 1000))
        adapter._consumer = self._open_consumer(kafka, topics, group, from_beginning, adapter, wait_ms)
        if group is not None:
            adapter._refused_session = lambda: self._refused_session(kafka, topics, group, from_beginning, adapter,
                                                                     wait_ms)
        return adapter

    def _open_consumer(self, kafka, topics: Sequence[str], group: Optional[str], from_beginning: bool, adapter,
                       wait_ms: int):
        try:
            consumer = kafka.KafkaConsumer(
                **self._options(), group_id=group,
                enable_auto_commit=False, auto_offset_reset="earliest" if from_beginning else "latest",
                max_partition_fetch_bytes=MAX_REQUEST_BYTES, fetch_max_bytes=4 * MAX_REQUEST_BYTES,
                session_timeout_ms=self.session_ms, heartbeat_interval_ms=heartbeat_interval_ms(self.session_ms),
                max_poll_interval_ms=300000, request_timeout_ms=30500,
                fetch_max_wait_ms=wait_ms,
            )
        except kafka.errors.KafkaError as exc:
            raise BusError(f"Kafka at {self.bootstrap} cannot be reached: {exc}.", hint=UNREACHABLE_HINT) from None
        # Load the topics' metadata before joining a group: a group leader that
        # assigns without it hands out nothing, and keeps doing so until its
        # next metadata refresh (minutes later).
        known = {}
        for topic in topics:
            known[topic] = consumer.partitions_for_topic(topic)
            if not known[topic]:
                consumer.close()
                if self.security.sasl:
                    # A topic the user may not describe looks absent.
                    raise BusError(f"the Kafka topic {topic} does not exist, or {self._who()} may not read it.",
                                   hint="create the topics with: trainwarden kafka init; or grant the user Read on "
                                        "the topic (deploy/kafka/README.md lists each service's ACLs)")
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
        return consumer

    def _refused_session(self, kafka, topics: Sequence[str], group: str, from_beginning: bool, adapter,
                         wait_ms: int):
        """The broker refused to join the group with our session timeout (its
        group.min.session.timeout.ms is higher): the default falls back to a
        stock broker's minimum, said once; an operator's choice is an error."""
        # This consumer's own: another consumer of this bus may have fallen back already.
        refused = adapter._consumer.config["session_timeout_ms"]
        if self._session_chosen or refused >= STOCK_MIN_SESSION_MS:
            raise BusError(f"Kafka at {self.bootstrap} refuses consumer sessions of {refused} ms "
                           "(its group.min.session.timeout.ms is higher).",
                           hint=f"lower group.min.session.timeout.ms on the broker (docs/OPERATIONS.md, Takeover), "
                                f"or set {SESSION_ENV} to at least its value ({STOCK_MIN_SESSION_MS} on a stock "
                                "broker)")
        if self.session_ms == STOCK_MIN_SESSION_MS:  # said once per bus, for its first consumer refused
            return self._open_consumer(kafka, topics, group, from_beginning, adapter, wait_ms)
        self.session_ms = STOCK_MIN_SESSION_MS
        _log.warning("Kafka at %s refuses consumer sessions of %d ms: using %d ms, so a killed processor or actuator "
                     "is replaced only after about %d s. Fix: set group.min.session.timeout.ms=1000 on the broker "
                     "(docs/OPERATIONS.md, Takeover)", self.bootstrap, refused, self.session_ms,
                     self.session_ms // 1000)
        return self._open_consumer(kafka, topics, group, from_beginning, adapter, wait_ms)

    def _who(self) -> str:
        return f"user {self.security.username}" if self.security.sasl else "this client"

    def close(self) -> None:
        """Clients own their connections; nothing is shared."""


def _refused(errors, exc, who: str, verb: str, topic: str) -> BusError:
    if isinstance(exc, errors.AuthorizationError):
        return BusError(f"Kafka does not let {who} {verb} the topic {topic} ({type(exc).__name__}).",
                        hint="grant the user that ACL on the broker (deploy/kafka/README.md lists each "
                             "service's), or run this service with its own credentials")
    return BusError(f"Kafka refused a message for {topic}: {exc}.")


class KafkaProducerAdapter:
    def __init__(self, producer, errors, who: str = "this client"):
        self._producer = producer
        self._errors = errors
        self._who = who
        # Sends fail asynchronously (an ACL refuses a topic only on the
        # broker): the sender thread records them, the next flush raises.
        self._failed: list[BusError] = []
        self._lock = threading.Lock()
        # Sent since the last flush began. A flush with nothing to wait for
        # still wakes the sender thread: an agent's loop flushes 20 times a
        # second and sends in 5 of them (a third of an idle agent's CPU).
        self._unflushed = False

    def send(self, topic: str, key: str, value: bytes) -> None:
        try:
            future = self._producer.send(topic, key=key.encode("utf-8"), value=value)
        except self._errors.KafkaError as exc:
            raise _refused(self._errors, exc, self._who, "write to", topic) from None
        # Set after the send: a flush that began before it still sees the flag.
        self._unflushed = True
        future.add_errback(self._record_failure, topic)

    def _record_failure(self, topic: str, exc: Exception) -> None:
        with self._lock:
            self._failed.append(_refused(self._errors, exc, self._who, "write to", topic))

    def flush(self, timeout_s: float = 30.0) -> None:
        if self._unflushed:
            # Cleared first: a send from another thread meanwhile sets it again, for the next flush.
            self._unflushed = False
            try:
                self._producer.flush(timeout=timeout_s)
            except self._errors.KafkaError as exc:
                self._unflushed = True
                raise BusError(f"Kafka did not acknowledge the messages in {timeout_s:.0f} s: {exc}.") from None
        with self._lock:
            failed, self._failed = self._failed, []
        if failed:
            first = failed[0]
            more = f" ({len(failed) - 1} more messages refused)" if len(failed) > 1 else ""
            raise BusError(f"{str(first).removesuffix('.')}{more}.", hint=first.hint)

    def close(self) -> None:
        try:
            self._producer.close(timeout=5)
        except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
            pass


class KafkaConsumerAdapter:
    def __init__(self, consumer, kafka, on_assign, who: str = "this client"):
        self._consumer = consumer
        self._kafka = kafka
        self._on_assign = on_assign
        self._who = who
        self.skipped_commits = 0
        # A group consumer's way to a new client when the broker refuses its session timeout.
        self._refused_session: Optional[Callable[[], object]] = None

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
        except self._kafka.errors.TopicAuthorizationFailedError as exc:
            topics = self._consumer.subscription() or {tp.topic for tp in self._consumer.assignment()}
            raise _refused(self._kafka.errors, exc, self._who, "read", ", ".join(sorted(topics)) or "its topics") from None
        except self._kafka.errors.GroupAuthorizationFailedError as exc:
            raise BusError(f"Kafka does not let {self._who} join the consumer group "
                           f"{self._consumer.config.get('group_id')} ({type(exc).__name__}).",
                           hint="grant the user Read on the group (deploy/kafka/README.md lists each "
                                "service's ACLs)") from None
        except self._kafka.errors.InvalidSessionTimeoutError:
            # Refused before the group was joined: nothing was read or assigned yet.
            if self._refused_session is None:
                raise BusError("Kafka refused this consumer's session timeout.") from None
            replacement = self._refused_session()
            self._consumer.close(autocommit=False)
            self._consumer = replacement
            return []
        except self._kafka.errors.KafkaError as exc:
            raise BusError(f"polling Kafka failed: {exc}.") from None
        records = []
        for tp, items in batches.items():
            for r in items:
                key = r.key.decode("utf-8", errors="replace") if r.key is not None else ""
                # timestamp_type 1: the broker's LogAppendTime, not the producer's CreateTime.
                records.append(Message(tp.topic, key, r.value, tp.partition, r.offset, r.timestamp,
                                       r.timestamp if r.timestamp_type == 1 else 0))
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
            # Asked again at the next poll when it times out: a lookup stuck
            # in a rebalance must not hold a restarted agent's heartbeat past
            # its node's timeout (10 s once took it 11 s to report in), and
            # one begun during a broker outage must outlast the reconnect
            # (2 s made the services ready 9 s after the broker).
            positions = {tp: self._consumer.position(tp, timeout_ms=5000) for tp in assigned}
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

    def lags(self) -> dict[tuple[str, int], int]:
        lags = {}
        for tp in list(self._consumer.assignment()):
            try:
                # The high watermark comes with every fetch response and the
                # position is the client's own; timeout 0 keeps it off the network.
                high, position = self._consumer.highwater(tp), self._consumer.position(tp, timeout_ms=0)
            except Exception:  # noqa: BLE001 - revoked by a rebalance between the two calls
                continue
            if high is not None and position is not None:
                lags[(tp.topic, tp.partition)] = max(0, high - position)
        return lags

    def positions(self) -> dict[tuple[str, int], int]:
        found = {}
        for tp in list(self._consumer.assignment()):
            try:
                position = self._consumer.position(tp, timeout_ms=0)
            except Exception:  # noqa: BLE001 - revoked by a rebalance meanwhile
                continue
            if position is not None:
                found[(tp.topic, tp.partition)] = position
        return found

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


def check_login(server: str, security: KafkaSecurity, client_id: str = "trainwarden") -> bool:
    """One connection to ``server`` through TLS and the SASL login. True when
    it got through; False when the broker could not be reached (the clients
    then wait for it as usual); BusError when the broker refused the login or
    the certificate, or speaks another protocol than ``security``'s."""
    kafka = _kafka()
    from kafka.conn import BrokerConnection, ConnectionStates

    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise BusError(f"the Kafka bootstrap server {server!r} is not HOST:PORT.",
                       hint="pass --bootstrap HOST:PORT or set TRAINWARDEN_KAFKA")
    try:
        family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError):
        return False
    # The furthest state the connection reached says where it was turned away.
    reached = [ConnectionStates.DISCONNECTED]

    def on_state_change(node_id, sock, conn) -> None:
        reached.append(conn.state)

    conn = BrokerConnection(host, int(port), family, client_id=client_id, state_change_callback=on_state_change,
                            request_timeout_ms=int(LOGIN_CHECK_S * 1000), **security.client_options())
    started = time.monotonic()
    try:
        if conn.connect_blocking(LOGIN_CHECK_S):
            return True
    except ssl.SSLCertVerificationError as exc:
        raise BusError(f"Kafka at {server} presented a TLS certificate this client does not trust: "
                       f"{exc.verify_message or exc.reason}.",
                       hint=f"give the CA that signed it with {source('SSL_CAFILE')}; the certificate must name "
                            f"{host}") from None
    except ssl.SSLError as exc:
        raise BusError(f"the TLS handshake with Kafka at {server} failed: {exc.reason or exc}.",
                       hint=f"check that its listener speaks TLS ({source('SECURITY_PROTOCOL')} is "
                            f"{security.protocol}) and the client certificate, if it asks for one") from None
    except kafka.errors.UnsupportedSaslMechanismError:
        raise BusError(f"Kafka at {server} does not offer the SASL mechanism {security.mechanism}.",
                       hint=f"set {source('SASL_MECHANISM')} to one its listener enables") from None
    except kafka.errors.KafkaError as exc:
        raise BusError(f"Kafka at {server} refused the connection ({security.describe()}): "
                       f"{type(exc).__name__}.", hint=f"check {source('SECURITY_PROTOCOL')} and its "
                                                      "credentials against the broker's listener") from None
    finally:
        conn.close()
    if time.monotonic() - started >= LOGIN_CHECK_S * 0.9:
        return False  # slow, not refused: no verdict
    if ConnectionStates.AUTHENTICATING in reached:
        raise BusError(f"Kafka at {server} refused the SASL login of user {security.username} "
                       f"({security.mechanism}).",
                       hint=f"check {source('SASL_USERNAME')} and the password from {security.password_source}; "
                            "the broker must have a credential of this mechanism for the user")
    if ConnectionStates.HANDSHAKE in reached and ConnectionStates.API_VERSIONS_SEND not in reached:
        raise BusError(f"Kafka at {server} closed the connection during the TLS handshake.",
                       hint=f"its listener may not speak TLS ({source('SECURITY_PROTOCOL')} is {security.protocol}), "
                            "or it wants a client certificate (TRAINWARDEN_KAFKA_SSL_CERTFILE and _KEYFILE)")
    if ConnectionStates.API_VERSIONS_SEND in reached or ConnectionStates.API_VERSIONS_RECV in reached:
        raise BusError(f"Kafka at {server} closed the connection before answering: its listener expects another "
                       f"security protocol than {security.protocol}.",
                       hint=f"set {source('SECURITY_PROTOCOL')} (and its credentials) to what the broker's "
                            "listener speaks, e.g. SASL_SSL")
    return False
