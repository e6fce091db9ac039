"""Signed bus messages: every message a Trainwarden service or command
produces carries an HMAC-SHA256 over what must not change, and every consumer
checks it before the message can make anything happen (docs/MESSAGES.md,
"Signed messages").

``SigningBus`` wraps any bus: its producers seal each value in an envelope,
its consumers open the envelopes, dead-letter and count what fails, and hand
the service only verified messages with the envelope removed. The services
never see a signature. Log lines are no exception: agents sign their batches,
and unsigned lines (Vector's, which cannot sign) are taken only where
``accept_unsigned_logs`` says so ($TRAINWARDEN_ACCEPT_UNSIGNED_LOGS).

Replays: a consumer remembers the ids of the messages it accepted (a bounded
window per topic) and refuses a copy at another offset; a message appended
after the consumer's partitions were assigned must also be younger than the
maximum age. What a partition already held at assignment (a processor's
replay from the beginning, an actuator's backlog after a restart) may be of
any age: it is history, read again.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import ipaddress
import os
import re
import time
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from trainwarden.bus.base import DEAD_LETTERS, LOGS, BusError, Message, TopicSpec
from trainwarden.bus.serde import SIGNED_PREFIX, dead_letter
from trainwarden.yamlsrc import ConfigError, ConfigErrors

ENV_KEY = "TRAINWARDEN_SIGNING_KEY"
ENV_KEY_FILE = "TRAINWARDEN_SIGNING_KEY_FILE"
ENV_MAX_AGE = "TRAINWARDEN_SIGNING_MAX_AGE"
ENV_TRUSTED = "TRAINWARDEN_TRUSTED_NETWORK"
# Vector ships the agents' log files and cannot sign: its unsigned log lines
# are taken only where this is set (the processor's --accept-unsigned-logs).
ENV_ACCEPT_UNSIGNED_LOGS = "TRAINWARDEN_ACCEPT_UNSIGNED_LOGS"
# The key given in $TRAINWARDEN_SIGNING_KEY has this id: a keyring line
# "default SECRET" verifies what it signed, which is how to move to a keyring.
ENV_KEY_ID = "default"
MIN_SECRET_CHARS = 32
MAX_KEYRING_BYTES = 64 * 1024
DEFAULT_MAX_AGE_S = 600.0
MAX_MAX_AGE_S = 7 * 86400.0
# A producer's clock may be ahead of the broker's by this much: a message
# signed later than it was appended cannot be a stale copy, but one signed a
# day ahead comes from a broken clock, and its copies would stay fresh as long.
MAX_AHEAD_S = 86400.0
# Ids remembered per topic and consumer: about 10 MB at most for each.
WINDOW_IDS = 50_000

_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The envelope is JSON, but a consumer reads its header by this fixed layout:
# no JSON parser ever runs on bytes that are not yet verified.
_HEADER = re.compile(rb'\{"tw_signed":1,"kid":"([A-Za-z0-9][A-Za-z0-9._-]{0,63})","ms":([0-9]{1,15}),'
                     rb'"id":"([0-9a-f]{32})","sig":"([0-9a-f]{64})","value":')
_DOMAIN = b"trainwarden-signed-1"
_KEY_HINT = "each line is KEY_ID SECRET; make a secret with: openssl rand -hex 32"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


# ------------------------------------------------------------------ keys


@dataclasses.dataclass(frozen=True, repr=False)
class Keyring:
    """Key ids and their secrets; the first key signs, every key verifies."""

    keys: tuple[tuple[str, bytes], ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring holds at least one key")

    @property
    def signing_id(self) -> str:
        return self.keys[0][0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    def secret(self, kid: str) -> Optional[bytes]:
        for known, secret in self.keys:
            if known == kid:
                return secret
        return None

    def __repr__(self) -> str:  # the secrets never appear, whatever prints this
        return f"Keyring(ids={self.ids!r}, source={self.source!r})"


def _secret_problem(secret: str) -> str:
    if not (secret.isascii() and secret.isprintable()) or any(c.isspace() for c in secret):
        return "the secret must be printable ASCII without spaces"
    if len(secret) < MIN_SECRET_CHARS:
        return f"the secret is {len(secret)} characters; the least is {MIN_SECRET_CHARS}"
    return ""


def parse_keyring(text: str, path: str) -> Keyring:
    """Lines ``KEY_ID SECRET``; blank lines and ``#`` comments are skipped.
    Every bad line is one error naming path:line; no error repeats a field
    of the file, since a misplaced secret could be any of them."""
    errors: list[ConfigError] = []
    keys: list[tuple[str, bytes]] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        if len(fields) != 2:
            errors.append(ConfigError(f"expected KEY_ID SECRET, found {len(fields)} fields", path, number, _KEY_HINT))
            continue
        kid, secret = fields
        if not _KEY_ID.fullmatch(kid):
            errors.append(ConfigError("the key id must be letters, digits, '.', '_' or '-' (at most 64, starting "
                                      "with a letter or digit)", path, number, _KEY_HINT))
            continue
        problem = _secret_problem(secret)
        if problem:
            errors.append(ConfigError(problem, path, number, _KEY_HINT))
            continue
        if kid in first_line:
            errors.append(ConfigError(f"the key id of line {first_line[kid]} again", path, number,
                                      "every key needs an id of its own"))
            continue
        first_line[kid] = number
        keys.append((kid, secret.encode("ascii")))
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    if not keys:
        raise ConfigError("the signing key file holds no key", path, hint=_KEY_HINT)
    return Keyring(tuple(keys), source=path)


def load_keyring(path: str) -> Keyring:
    try:
        with open(path, "rb") as handle:
            status = os.fstat(handle.fileno())
            raw = handle.read(MAX_KEYRING_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"the signing key file cannot be read ({exc.strerror or exc})", path,
                          hint=f"give a readable file with --signing-key-file or ${ENV_KEY_FILE}") from None
    problem = _key_file_problem(status.st_mode, status.st_gid)
    if problem:
        # Whoever can read the key can sign commands that every agent runs.
        raise ConfigError(f"the signing key file is {problem} (mode {status.st_mode & 0o777:04o})", path,
                          hint=f"chmod 600 {path}: only the services' user may read it (and no job runs as that "
                               "user: --run-as)")
    if len(raw) > MAX_KEYRING_BYTES:
        raise ConfigError(f"the signing key file is larger than {MAX_KEYRING_BYTES} bytes", path, hint=_KEY_HINT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("the signing key file is not UTF-8 text", path, hint=_KEY_HINT) from None
    return parse_keyring(text, path)


def _key_file_problem(mode: int, gid: int) -> str:
    """Why a keyring file with this mode and group is open to others than
    this service, or "". Group read is the service's own group's (a
    Kubernetes Secret mounted with the pod's fsGroup, mode 0440): no job has
    that group (--run-as gives it the job user's group and no other)."""
    if mode & 0o007:
        return "open to others"
    if mode & 0o020:
        return "writable by its group"
    if mode & 0o040 and gid != os.getegid():
        return f"readable by group {gid}, which is not this service's own"
    return ""


def keyring_from(environ: Mapping[str, str], key_file: Optional[str] = None) -> Optional[Keyring]:
    """The operator's keys: a keyring file (``key_file``, else
    $TRAINWARDEN_SIGNING_KEY_FILE) or one key in $TRAINWARDEN_SIGNING_KEY;
    None when neither is set."""
    key_file = key_file or environ.get(ENV_KEY_FILE, "")
    key = environ.get(ENV_KEY, "")
    if key_file and key:
        raise ConfigError(f"both a signing key file and ${ENV_KEY} are given",
                          hint=f"give one: the file for rotation by key id, ${ENV_KEY} for a single key")
    if key_file:
        return load_keyring(key_file)
    if not key:
        return None
    problem = _secret_problem(key)
    if problem:
        raise ConfigError(f"${ENV_KEY}: {problem}", hint="make one with: openssl rand -hex 32")
    return Keyring(((ENV_KEY_ID, key.encode("ascii")),), source=f"${ENV_KEY}")


def max_age(text: str) -> float:
    """Seconds of --signing-max-age: ASCII digits only, 1 to 7 days at most."""
    if not re.fullmatch(r"[0-9]{1,7}(\.[0-9]{1,3})?", text.strip()):
        raise ValueError(f"{text!r} is not a number of seconds")
    seconds = float(text)
    if not 1.0 <= seconds <= MAX_MAX_AGE_S:
        raise ValueError(f"{text} is not from 1 to {MAX_MAX_AGE_S:.0f} seconds")
    return seconds


def flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"${name} must be 1/true/yes/on or 0/false/no/off, not {environ[name]!r}",
                          hint="unset it or give the flag on the command line")
    return value in _TRUE


@dataclasses.dataclass(frozen=True)
class SigningConfig:
    keyring: Keyring
    max_age_s: float = DEFAULT_MAX_AGE_S
    window: int = WINDOW_IDS
    # Unsigned messages on the logs topic are taken (Vector's); every other unsigned message stays refused.
    accept_unsigned_logs: bool = False


# ------------------------------------------------------------- networks


def loopback_only(bootstrap: str) -> bool:
    """Every broker of HOST:PORT[,HOST:PORT] is on this host (127.0.0.0/8, ::1, localhost)."""
    servers = [s.strip() for s in bootstrap.split("://", 1)[-1].split(",")]
    return bool(servers) and all(_loopback_host(server) for server in servers)


def _loopback_host(server: str) -> bool:
    if server.startswith("["):
        host = server[1:].split("]", 1)[0]
    elif server.count(":") > 1:
        host = server  # a bare IPv6 address, no port
    else:
        host = server.rsplit(":", 1)[0] if ":" in server else server
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name may resolve anywhere


def untrusted_network(bootstrap: str) -> ConfigError:
    return ConfigError(f"refusing to use the Kafka broker at {bootstrap} without a signing key, since anyone who "
                       "can produce to it could command this cluster.",
                       hint=f"set ${ENV_KEY_FILE} (a keyring, docs/MESSAGES.md) or ${ENV_KEY} for every service "
                            f"and command, or pass --trusted-network (${ENV_TRUSTED}=1) if only trusted hosts reach "
                            "the broker")


# ------------------------------------------------------- sealing, opening


def _mac(secret: bytes, topic: str, key: str, kid: bytes, ms: bytes, message_id: bytes, value: bytes) -> str:
    # Length-prefixed fields: no two different messages share the signed bytes.
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (_DOMAIN, topic.encode("utf-8"), key.encode("utf-8"), kid, ms, message_id, value):
        mac.update(b"%d:" % len(part))
        mac.update(part)
    return mac.hexdigest()


def seal(keyring: Keyring, topic: str, key: str, value: bytes, now_s: float, message_id: str) -> bytes:
    """The signed envelope of ``value`` (a JSON document) for ``topic``/``key``."""
    kid = keyring.signing_id.encode("ascii")
    ms = b"%d" % int(now_s * 1000)
    mid = message_id.encode("ascii")
    sig = _mac(keyring.keys[0][1], topic, key, kid, ms, mid, value).encode("ascii")
    return b"".join((SIGNED_PREFIX, b'"kid":"', kid, b'","ms":', ms, b',"id":"', mid, b'","sig":"', sig,
                     b'","value":', value, b"}"))


REFUSALS = ("unsigned", "bad_signature", "unknown_key_id", "replayed", "expired")


class Verdict(NamedTuple):
    message: Optional[Message]  # the verified message, envelope removed; None when refused
    refusal: str = ""  # one of REFUSALS
    reason: str = ""  # the dead letter's error


class Verifier:
    """Opens envelopes; remembers the ids it accepted, per topic, bounded."""

    def __init__(self, config: SigningConfig):
        self.config = config
        self._seen: dict[str, collections.OrderedDict] = {}

    def open(self, record: Message, now: float, backlog: bool) -> Verdict:
        """``backlog``: the record was in its partition before this consumer
        was assigned it, so its age says nothing about a replay."""
        value = record.value
        if not value or not value.startswith(SIGNED_PREFIX):
            if record.topic == LOGS and self.config.accept_unsigned_logs:
                # Vector, which ships the agents' log files, cannot sign. Its
                # lines count only for an instance that runs on the node they
                # name (services/processor.py); anyone who may produce to the
                # topic can still claim that node, hence an explicit setting.
                return Verdict(record)
            if record.topic == LOGS:
                # A line that keeps an instance "alive" is as good as a command
                # that keeps it from being restarted: only agents, which sign.
                return Verdict(None, "unsigned", "unsigned: the log message carries no signature (lines shipped by "
                                                 f"Vector need ${ENV_ACCEPT_UNSIGNED_LOGS}=1 on the processor)")
            return Verdict(None, "unsigned", "unsigned: the message carries no signature")
        match = _HEADER.match(value)
        if match is None or not value.endswith(b"}"):
            return Verdict(None, "bad_signature", "bad signature: the signature envelope is malformed")
        kid, ms, mid, sig = match.groups()
        key_id = kid.decode("ascii")
        secret = self.config.keyring.secret(key_id)
        if secret is None:
            return Verdict(None, "unknown_key_id", f"unknown key id {key_id}")
        body = value[match.end():-1]
        if not hmac.compare_digest(_mac(secret, record.topic, record.key, kid, ms, mid, body), sig.decode("ascii")):
            return Verdict(None, "bad_signature", f"bad signature (key id {key_id})")
        seen = self._seen.setdefault(record.topic, collections.OrderedDict())
        position = (record.partition, record.offset)
        earlier = seen.get(mid)
        if earlier is not None and earlier != position:
            return Verdict(None, "replayed", f"replayed: message id {mid.decode()} was read before at partition "
                                             f"{earlier[0]} offset {earlier[1]}")
        # The age is judged on the broker's clock when the topic records its
        # append time (no producer can set it; `kafka init` configures it), so
        # the consumer's own clock plays no part; else on this consumer's. Only
        # a message signed long BEFORE that is refused: a copy is always older
        # than its original, while a producer whose clock is ahead signs "in
        # the future" (a submit from a host an hour ahead must run), so that
        # direction is allowed up to MAX_AHEAD_S.
        appended = record.append_ms / 1000.0 if record.append_ms else None
        age = (now if appended is None else appended) - int(ms) / 1000.0
        when = "read" if appended is None else "appended"
        if not backlog and age > self.config.max_age_s:
            behind = "" if appended is None else "; or its producer's clock is that far behind the broker's"
            return Verdict(None, "expired", f"expired: signed {age:.0f} s before it was {when}; the most is "
                                            f"{self.config.max_age_s:.0f} s (--signing-max-age){behind}")
        if not backlog and -age > MAX_AHEAD_S:
            return Verdict(None, "expired", f"expired: signed {-age:.0f} s after it was {when}; a producer's "
                                            f"clock may be at most {MAX_AHEAD_S:.0f} s ahead: check its time")
        if earlier is None:
            seen[mid] = position
            if len(seen) > self.config.window:
                seen.popitem(last=False)
        # The signed time replaces the record's, which any producer can set:
        # a service that judges a message's age (an agent's start commands) judges a time no copy can change.
        return Verdict(dataclasses.replace(record, value=body, timestamp_ms=int(ms)))


# ------------------------------------------------------------------ bus


@dataclasses.dataclass
class SigningCounters:
    """Messages refused, by reason (each also a dead letter)."""

    unsigned: int = 0
    bad_signature: int = 0
    unknown_key_id: int = 0
    replayed: int = 0
    expired: int = 0
    dead_letters_lost: int = 0


class SigningBus:
    def __init__(self, inner, config: SigningConfig, service: str = "trainwarden",
                 clock: Callable[[], float] = time.time):
        # The host's wall clock, not clock.py's step-free one: a
        # signature's time is held against the broker's clock, which NTP keeps
        # near the hosts' wall clocks; a service started before a step would
        # otherwise sign by a clock that is off by the step for as long as it runs.
        self.inner = inner
        self.config = config
        self.service = service
        self.clock = clock
        self.counters = SigningCounters()

    def producer(self) -> "SigningProducer":
        return SigningProducer(self.inner.producer(), self.config.keyring, self.clock)

    def consumer(self, topics: Sequence[str], group: Optional[str], from_beginning: bool = False,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]] = None,
                 fetch_wait_s: Optional[float] = None) -> "SigningConsumer":
        return SigningConsumer(self, topics, group, from_beginning, on_assign, fetch_wait_s)

    def create_topics(self, specs: Sequence[TopicSpec]) -> list[str]:
        return self.inner.create_topics(specs)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # the transport's own (bootstrap, for the readiness check)


class SigningProducer:
    def __init__(self, inner, keyring: Keyring, clock: Callable[[], float]):
        self._inner = inner
        self._keyring = keyring
        self._clock = clock

    def send(self, topic: str, key: str, value: bytes) -> None:
        self._inner.send(topic, key, seal(self._keyring, topic, key, value, self._clock(), os.urandom(16).hex()))

    def flush(self, timeout_s: float = 30.0) -> None:
        self._inner.flush(timeout_s)

    def close(self) -> None:
        self._inner.close()


class SigningConsumer:
    def __init__(self, bus: SigningBus, topics: Sequence[str], group: Optional[str], from_beginning: bool,
                 on_assign: Optional[Callable[[list[tuple[str, int]]], None]], fetch_wait_s: Optional[float] = None):
        self._bus = bus
        self._verifier = Verifier(bus.config)
        # Partition -> its end offset when assigned (below it: backlog), and
        # the partitions whose end is still to be read. The end is read after
        # the poll that assigned them: a Kafka client must not be called from
        # inside its own rebalance callback.
        self._boundary: dict[tuple[str, int], int] = {}
        self._unresolved: set[tuple[str, int]] = set()
        self._letters: Optional[SigningProducer] = None
        # The last offset poll went past in each partition, handed over or
        # refused: whoever waits for a partition's end (read_to_end, the
        # processor's replay) must not wait for a record that was refused.
        self.offsets_read: dict[tuple[str, int], int] = {}
        # Records refused already: read again (a seek back, a redelivery) they are not dead-lettered twice.
        self._refused: collections.OrderedDict = collections.OrderedDict()

        def assigned(partitions: list[tuple[str, int]]) -> None:
            self._unresolved.update(partitions)
            for partition in partitions:
                self.offsets_read.pop(partition, None)
            if on_assign is not None:
                on_assign(partitions)

        self._inner = bus.inner.consumer(topics, group, from_beginning=from_beginning, on_assign=assigned,
                                         fetch_wait_s=fetch_wait_s)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Message]:
        records = self._inner.poll(timeout_s, max_records)
        self._resolve()
        now = self._bus.clock()
        verified = []
        for record in records:
            where = (record.topic, record.partition)
            self.offsets_read[where] = max(self.offsets_read.get(where, -1), record.offset)
            # An unresolved boundary counts as live: the age check applies.
            backlog = record.offset < self._boundary.get(where, -1)
            verdict = self._verifier.open(record, now, backlog)
            if verdict.message is not None:
                verified.append(verdict.message)
            else:
                self._refuse(record, verdict, now)
        return verified

    def _resolve(self) -> None:
        for topic, partition in list(self._unresolved):
            try:
                self._boundary[(topic, partition)] = self._inner.end_offset(topic, partition)
            except BusError:
                continue  # tried again after the next poll
            self._unresolved.discard((topic, partition))

    def _refuse(self, record: Message, verdict: Verdict, now: float) -> None:
        position = (record.topic, record.partition, record.offset)
        if position in self._refused:
            return
        self._refused[position] = True
        if len(self._refused) > self._bus.config.window:
            self._refused.popitem(last=False)
        counters = self._bus.counters
        setattr(counters, verdict.refusal, getattr(counters, verdict.refusal) + 1)
        service = self._bus.service
        try:
            if self._letters is None:
                self._letters = self._bus.producer()
            self._letters.send(DEAD_LETTERS, service, dead_letter(record, service, verdict.reason, now))
        except BusError:
            # Never raised out of poll: the messages behind this one must still be handed over.
            counters.dead_letters_lost += 1

    def seek_to_beginning(self, partitions: Sequence[tuple[str, int]]) -> None:
        self._inner.seek_to_beginning(partitions)
        for topic, partition in partitions:
            self.offsets_read.pop((topic, partition), None)
            try:
                self._boundary[(topic, partition)] = self._inner.end_offset(topic, partition)
            except BusError:
                self._unresolved.add((topic, partition))

    def commit(self) -> None:
        # The dead letters of what was polled are durable before its offsets are committed.
        if self._letters is not None:
            self._letters.flush()
        self._inner.commit()

    def assignment(self) -> list[tuple[str, int]]:
        return self._inner.assignment()

    def ready(self) -> bool:
        return self._inner.ready()

    def end_offset(self, topic: str, partition: int) -> int:
        return self._inner.end_offset(topic, partition)

    def lags(self) -> dict[tuple[str, int], int]:
        return self._inner.lags()

    def positions(self) -> dict[tuple[str, int], int]:
        return self._inner.positions()

    def close(self) -> None:
        try:
            if self._letters is not None:
                self._letters.flush(5)
                self._letters.close()
        except BusError:
            self._bus.counters.dead_letters_lost += 1
        finally:
            self._inner.close()

    def __getattr__(self, name: str):
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)  # the transport's own


def describe(bus) -> str:
    """The signing of a bus in one clause, for a service's start line (key ids, never secrets)."""
    if not isinstance(bus, SigningBus):
        return "messages unsigned"
    keyring = bus.config.keyring
    count = len(keyring.ids)
    verify = "key id verifies" if count == 1 else "key ids verify"
    unsigned_logs = "; unsigned log lines taken" if bus.config.accept_unsigned_logs else ""
    return f"messages signed with key id {keyring.signing_id} ({count} {verify}){unsigned_logs}"
