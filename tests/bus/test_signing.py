"""Signed bus messages on the in-process bus, on a pinned clock: sealing and
opening, refusals dead-lettered with their reason, key rotation, replays,
the keyring file, and the refusal of an untrusted broker without a key."""

import json
import os

import pytest

from trainwarden.bus import COMMANDS, DEAD_LETTERS, DECISIONS, EVENTS, LOGS, open_bus, topic_specs
from trainwarden.bus.base import read_to_end
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.bus.signing import (
    Keyring,
    SigningBus,
    SigningConfig,
    Verifier,
    keyring_from,
    load_keyring,
    loopback_only,
    parse_keyring,
)
from trainwarden.events import JobSubmitted
from trainwarden.rules.loader import load_rules
from trainwarden.services.processor import Processor
from trainwarden.simulation.cluster import instance_specs
from trainwarden.yamlsrc import ConfigError

T0 = 1_800_000_000.0
SECRET1 = "a" * 16 + "1" * 16
SECRET2 = "b" * 16 + "2" * 16
K1 = Keyring((("k1", SECRET1.encode()),))
K2 = Keyring((("k2", SECRET2.encode()),))
COMMAND = b'{"v":1,"type":"stop_instances","node":"n1","job_id":"j1","action_id":"a1","instances":["worker-0"]}'


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _signed(memory: MemoryBus, keyring: Keyring = K1, clock: Clock | None = None, max_age_s: float = 600.0,
            window: int = 1000) -> SigningBus:
    return SigningBus(memory, SigningConfig(keyring, max_age_s, window), "agent", clock or Clock())


def _memory() -> MemoryBus:
    memory = MemoryBus()
    memory.create_topics(topic_specs(2))
    return memory


def _letters(memory: MemoryBus, keyring: Keyring = K1) -> list[dict]:
    consumer = _signed(memory, keyring).consumer([DEAD_LETTERS], None, from_beginning=True)
    return [json.loads(r.value) for r in consumer.poll(0.1, 1000)]


def _read(bus, topics=(COMMANDS,)):
    return bus.consumer(list(topics), None, from_beginning=True).poll(0.1, 1000)


def test_a_signed_message_reaches_the_consumer_verified_and_without_its_envelope():
    memory = _memory()
    bus = _signed(memory)
    bus.producer().send(COMMANDS, "n1", COMMAND)
    [record] = _read(memory)
    raw = record.value
    assert raw.startswith(b'{"tw_signed":1,"kid":"k1",') and json.loads(raw)["value"] == json.loads(COMMAND)
    [record] = _read(bus)
    assert (record.topic, record.key, record.value, record.timestamp_ms) == (COMMANDS, "n1", COMMAND, T0 * 1000)
    assert decode(COMMANDS, record.value).instances == ("worker-0",)


def test_an_unsigned_message_is_dead_lettered_as_unsigned_and_the_one_behind_it_still_arrives():
    memory = _memory()
    bus = _signed(memory)
    memory.producer().send(COMMANDS, "n1", COMMAND)
    bus.producer().send(COMMANDS, "n1", COMMAND.replace(b"a1", b"a2"))
    records = _read(bus)
    assert [decode(COMMANDS, r.value).action_id for r in records] == ["a2"]
    assert bus.counters.unsigned == 1
    [letter] = _letters(memory)
    assert (letter["service"], letter["topic"], letter["error"]) == ("agent", COMMANDS,
                                                                     "unsigned: the message carries no signature")


LINE = b'{"v":1,"type":"log_line","job_id":"j1","instance":"worker-0","round":0,"start":0,"node":"n1",' \
       b'"time":1.0,"stream":"stdout","text":"step 1"}'


def test_an_unsigned_log_line_is_dead_lettered_as_unsigned_like_any_other_unsigned_message():
    memory = _memory()
    bus = _signed(memory)
    memory.producer().send(LOGS, "j1", LINE)  # anyone who can produce to the topic, claiming to be an agent
    bus.producer().send(LOGS, "j1", LINE.replace(b"step 1", b"step 2"))  # an agent's, signed
    records = _read(bus, (LOGS,))
    assert [decode(LOGS, r.value).text for r in records] == ["step 2"]
    assert bus.counters.unsigned == 1
    [letter] = _letters(memory)
    assert letter["topic"] == LOGS and letter["error"].startswith("unsigned: the log message carries no signature")
    assert "TRAINWARDEN_ACCEPT_UNSIGNED_LOGS=1" in letter["error"]


def test_unsigned_log_lines_as_vector_ships_them_are_taken_only_where_accepted_and_nothing_else_unsigned_is():
    memory = _memory()
    bus = SigningBus(memory, SigningConfig(K1, accept_unsigned_logs=True), "processor", Clock())
    memory.producer().send(LOGS, "j1", LINE)  # as Vector ships it
    _signed(memory, K2).producer().send(LOGS, "j1", LINE)  # signed, but with a key this consumer does not hold
    records = _read(bus, (LOGS,))
    assert [r.value for r in records] == [LINE]
    assert bus.counters.unsigned == 0 and bus.counters.unknown_key_id == 1
    # Everything else that is unsigned stays refused.
    memory.producer().send(EVENTS, "j1", LINE)
    assert _read(bus, (EVENTS,)) == [] and bus.counters.unsigned == 1


def test_the_setting_for_unsigned_log_lines_is_read_strictly_from_the_environment(monkeypatch):
    monkeypatch.setenv("TRAINWARDEN_SIGNING_KEY", SECRET1)
    monkeypatch.delenv("TRAINWARDEN_SIGNING_KEY_FILE", raising=False)
    monkeypatch.delenv("TRAINWARDEN_ACCEPT_UNSIGNED_LOGS", raising=False)
    assert open_bus("memory").config.accept_unsigned_logs is False
    monkeypatch.setenv("TRAINWARDEN_ACCEPT_UNSIGNED_LOGS", "1")
    assert open_bus("memory").config.accept_unsigned_logs is True
    assert open_bus("memory", accept_unsigned_logs=False).config.accept_unsigned_logs is False
    monkeypatch.setenv("TRAINWARDEN_ACCEPT_UNSIGNED_LOGS", "sometimes")
    with pytest.raises(ConfigError, match="TRAINWARDEN_ACCEPT_UNSIGNED_LOGS must be 1/true/yes/on"):
        open_bus("memory")


def test_a_changed_value_key_or_topic_breaks_the_signature():
    memory = _memory()
    bus = _signed(memory)
    bus.producer().send(COMMANDS, "n1", COMMAND)
    [raw] = _read(memory)
    plain = memory.producer()
    plain.send(COMMANDS, "n1", raw.value.replace(b"worker-0", b"worker-1"))
    plain.send(COMMANDS, "n2", raw.value)
    plain.send(DECISIONS, "n1", raw.value)
    plain.send(COMMANDS, "n1", raw.value.replace(b'"kid":"k1"', b'"kid":"k1","x":1'))
    assert len(_read(bus, (COMMANDS, DECISIONS))) == 1
    errors = sorted(letter["error"] for letter in _letters(memory))
    assert errors == ["bad signature (key id k1)"] * 3 + ["bad signature: the signature envelope is malformed"]
    assert bus.counters.bad_signature == 4


def test_a_message_signed_with_an_unknown_key_id_is_refused_naming_it():
    memory = _memory()
    _signed(memory, K2).producer().send(COMMANDS, "n1", COMMAND)
    bus = _signed(memory, K1)
    assert _read(bus) == []
    assert [letter["error"] for letter in _letters(memory)] == ["unknown key id k2"]
    assert bus.counters.unknown_key_id == 1


def test_rotation_by_key_id_both_keys_of_a_keyring_verify_and_the_first_signs():
    memory = _memory()
    both = Keyring((("k2", SECRET2.encode()), ("k1", SECRET1.encode())))
    _signed(memory, K1).producer().send(COMMANDS, "n1", COMMAND)
    _signed(memory, both).producer().send(COMMANDS, "n1", COMMAND.replace(b"a1", b"a2"))
    assert len(_read(_signed(memory, both))) == 2
    assert len(_read(_signed(memory, Keyring((("k1", SECRET1.encode()), ("k2", SECRET2.encode())))))) == 2
    # k1 rotated out: what it signed is refused, what k2 signs is read.
    rotated = _signed(memory, K2)
    assert [decode(COMMANDS, r.value).action_id for r in _read(rotated)] == ["a2"]
    assert rotated.counters.unknown_key_id == 1


def test_a_copy_of_a_genuine_message_is_refused_as_replayed_but_a_redelivery_is_not():
    memory = _memory()
    bus = _signed(memory)
    bus.producer().send(COMMANDS, "n1", COMMAND)
    consumer = bus.consumer([COMMANDS], "agents", from_beginning=True)
    assert len(consumer.poll(0.1)) == 1
    [raw] = _read(memory)
    memory.producer().send(COMMANDS, "n1", raw.value)  # the attacker's copy
    assert consumer.poll(0.1) == []
    assert bus.counters.replayed == 1
    assert _letters(memory)[0]["error"].startswith("replayed: message id ")
    # Reading the same records again (a seek, an uncommitted redelivery): the
    # original is no replay, and the copy is not dead-lettered a second time.
    consumer.seek_to_beginning(consumer.assignment())
    assert len(consumer.poll(0.1)) == 1 and bus.counters.replayed == 1 and len(_letters(memory)) == 1


def test_a_live_message_older_than_the_maximum_age_is_refused_as_expired():
    memory = _memory()
    clock = Clock()
    bus = _signed(memory, clock=clock, max_age_s=600)
    consumer = bus.consumer([COMMANDS], "agents", from_beginning=False)
    consumer.poll(0.0)  # assigned: from now on every message is live
    old = _signed(memory, clock=Clock(T0 - 601))
    old.producer().send(COMMANDS, "n1", COMMAND)
    _signed(memory, clock=Clock(T0 - 599)).producer().send(COMMANDS, "n1", COMMAND.replace(b"a1", b"a2"))
    assert [decode(COMMANDS, r.value).action_id for r in consumer.poll(0.1)] == ["a2"]
    assert bus.counters.expired == 1
    assert _letters(memory)[0]["error"] == "expired: signed 601 s before it was read; the most is 600 s " \
                                           "(--signing-max-age)"


def test_what_a_partition_held_before_the_consumer_was_assigned_is_read_at_any_age():
    memory = _memory()
    _signed(memory, clock=Clock(T0)).producer().send(COMMANDS, "n1", COMMAND)
    late = _signed(memory, clock=Clock(T0 + 86400))
    consumer = late.consumer([COMMANDS], "agents", from_beginning=True)
    assert len(consumer.poll(0.1)) == 1
    assert late.counters.expired == 0


def test_a_restarted_processor_replays_its_partitions_from_the_beginning_at_any_age():
    memory = _memory()
    pack = load_rules(None)
    submitted = JobSubmitted(job_id="j1", time=T0, framework="pytorch", args="",
                             instances=instance_specs([("worker", 1)]))
    _signed(memory, clock=Clock(T0)).producer().send(EVENTS, "j1", encode(submitted))
    first = Processor(_signed(memory, clock=Clock(T0)), pack, clock=Clock(T0))
    for _ in range(3):
        first.run_once(0.05)
    assert "j1" in first.jobs
    first.close()
    an_hour_later = Clock(T0 + 3600)
    bus = _signed(memory, clock=an_hour_later)
    second = Processor(bus, pack, clock=an_hour_later)
    for _ in range(3):
        second.run_once(0.05)
    assert "j1" in second.jobs and second.counters.replayed >= 2
    assert bus.counters == type(bus.counters)()  # nothing refused: not the submission, not the decision records
    second.close()


def test_a_restarted_processor_finishes_its_replay_when_the_last_event_of_its_partition_is_refused():
    memory = _memory()
    pack = load_rules(None)
    submitted = JobSubmitted(job_id="j1", time=T0, framework="pytorch", args="",
                             instances=instance_specs([("worker", 1)]))
    _signed(memory).producer().send(EVENTS, "j1", encode(submitted))
    first = Processor(_signed(memory), pack, clock=Clock(T0))
    first.run_once(0.05)
    first.close()
    memory.producer().send(EVENTS, "j1", encode(submitted).replace(b'"j1"', b'"forged"'))  # after the records
    bus = _signed(memory)
    second = Processor(bus, pack, clock=Clock(T0 + 1))
    for _ in range(3):
        second.run_once(0.05)
    assert second.replays == {} and "j1" in second.jobs and bus.counters.unsigned == 1


def test_reading_a_topic_to_its_end_ends_when_its_last_record_is_refused():
    memory = _memory()
    bus = _signed(memory)
    bus.producer().send(COMMANDS, "n1", COMMAND)
    memory.producer().send(COMMANDS, "n1", COMMAND)  # forged, last in its partition
    consumer = bus.consumer([COMMANDS], None, from_beginning=True)
    assert [r.value for r in read_to_end(consumer, timeout_s=10)] == [COMMAND]
    assert bus.counters.unsigned == 1


def test_poison_in_place_of_an_envelope_is_refused_as_unsigned_and_costs_nothing_behind_it():
    memory = _memory()
    bus = _signed(memory)
    plain = memory.producer()
    plain.send(COMMANDS, "n1", b"[" * 10_000 + b"]" * 10_000)
    plain.send(COMMANDS, "n1", b'{"tw_signed":1,' + b"[" * 10_000)
    plain.send(COMMANDS, "n1", b"\xff\xfe not json")
    bus.producer().send(COMMANDS, "n1", COMMAND)
    assert [r.value for r in _read(bus)] == [COMMAND]
    assert (bus.counters.unsigned, bus.counters.bad_signature) == (2, 1)


def test_the_replay_window_is_bounded():
    memory = _memory()
    bus = _signed(memory, window=3)
    for index in range(10):
        bus.producer().send(COMMANDS, "n1", COMMAND.replace(b"a1", b"a%d" % index))
    verifier = Verifier(bus.config)
    for record in memory.consumer([COMMANDS], None, from_beginning=True).poll(0.1, 100):
        assert verifier.open(record, T0, backlog=False).message is not None
    assert len(verifier._seen[COMMANDS]) == 3


def test_a_consumer_without_a_key_says_the_message_is_signed():
    memory = _memory()
    _signed(memory).producer().send(COMMANDS, "n1", COMMAND)
    [raw] = _read(memory)
    with pytest.raises(DecodeError, match="signed and this service has no signing key"):
        decode(COMMANDS, raw.value)


# ---------------------------------------------------------------- keyring


def _keyfile(directory, text: str, name: str = "keys"):
    path = directory / name
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("mode, gid, problem", [
    (0o604, None, "open to others"), (0o644, None, "open to others"), (0o602, None, "open to others"),
    (0o620, None, "writable by its group"), (0o660, None, "writable by its group"),
    (0o640, 54321, "readable by group 54321, which is not this service's own"),
])
def test_a_keyring_file_open_to_others_is_refused_with_the_chmod_to_run(tmp_path, mode, gid, problem):
    path = _keyfile(tmp_path, f"k1 {SECRET1}\n")
    path.chmod(mode)
    if gid is not None:
        if os.geteuid() != 0:
            pytest.skip("changing a file's group to one this user is not in needs root")
        os.chown(path, -1, gid)
    with pytest.raises(ConfigError) as caught:
        load_keyring(str(path))
    assert str(caught.value) == f"{path}: the signing key file is {problem} (mode {mode:04o})"
    assert f"chmod 600 {path}" in caught.value.hint and SECRET1 not in str(caught.value) + caught.value.hint


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o440])
def test_a_keyring_file_of_the_service_alone_or_its_own_group_is_read(tmp_path, mode):
    # 0440 with the service's own group: a Kubernetes Secret mounted with the pod's fsGroup.
    path = _keyfile(tmp_path, f"k1 {SECRET1}\n")
    os.chown(path, -1, os.getegid())
    path.chmod(mode)
    assert load_keyring(str(path)).ids == ("k1",)


def test_a_keyring_file_reads_ids_and_secrets_skipping_comments_and_its_repr_shows_no_secret(tmp_path):
    path = _keyfile(tmp_path, f"# new key first\nk2 {SECRET2}\n\n  k1   {SECRET1}  \n")
    keyring = load_keyring(str(path))
    assert keyring.ids == ("k2", "k1") and keyring.signing_id == "k2"
    assert keyring.secret("k1") == SECRET1.encode()
    for shown in (repr(keyring), repr(SigningConfig(keyring)), str(keyring)):
        assert SECRET1 not in shown and SECRET2 not in shown and "k2" in shown


def test_every_bad_keyring_line_is_one_error_naming_file_and_line_and_none_shows_a_secret(tmp_path):
    short = "s3cr3t-but-short"
    path = _keyfile(tmp_path, "\n".join([f"k1 {SECRET1}", f"k2 {short}", f"{SECRET2}", f"k3 {SECRET2} extra",
                                         f"-bad {SECRET2}", f"k1 {SECRET2}", f"k4 {SECRET2[:-1]}\u00e9"]) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_keyring(str(path))
    lines = str(caught.value).splitlines()
    assert lines == [f"{path}:2: the secret is 16 characters; the least is 32",
                     f"{path}:3: expected KEY_ID SECRET, found 1 fields",
                     f"{path}:4: expected KEY_ID SECRET, found 3 fields",
                     f"{path}:5: the key id must be letters, digits, '.', '_' or '-' (at most 64, starting with a "
                     "letter or digit)",
                     f"{path}:6: the key id of line 1 again",
                     f"{path}:7: the secret must be printable ASCII without spaces"]
    assert all(secret not in str(caught.value) for secret in (SECRET1, SECRET2, short))
    assert "openssl rand" in caught.value.hint


def test_an_empty_or_unreadable_keyring_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no key"):
        load_keyring(str(_keyfile(tmp_path, "# nothing yet\n", "empty")))
    with pytest.raises(ConfigError, match="cannot be read"):
        load_keyring(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="1 fields"):
        parse_keyring("onlyone\n", "keys")


def test_keys_from_the_environment_are_checked_and_never_echoed(tmp_path):
    assert keyring_from({}) is None
    assert keyring_from({"TRAINWARDEN_SIGNING_KEY": SECRET1}).ids == ("default",)
    with pytest.raises(ConfigError) as caught:
        keyring_from({"TRAINWARDEN_SIGNING_KEY": "tooshort-secret"})
    assert "15 characters" in str(caught.value) and "tooshort-secret" not in str(caught.value)
    _keyfile(tmp_path, f"k1 {SECRET1}\n")
    with pytest.raises(ConfigError, match="both"):
        keyring_from({"TRAINWARDEN_SIGNING_KEY": SECRET1}, str(tmp_path / "keys"))
    assert keyring_from({"TRAINWARDEN_SIGNING_KEY_FILE": str(tmp_path / "keys")}).ids == ("k1",)


# ---------------------------------------------------------------- networks


@pytest.mark.parametrize("bootstrap, loopback", [
    ("127.0.0.1:29092", True), ("127.3.4.5:9092", True), ("localhost:9092", True), ("[::1]:9092", True),
    ("kafka://127.0.0.1:9092,localhost:9093", True), ("127.0.0.1:9092,10.0.0.5:9092", False),
    ("10.255.255.1:9092", False), ("kafka.example:9092", False), ("127.0.0.1.example:9092", False),
])
def test_only_brokers_on_this_host_count_as_loopback(bootstrap, loopback):
    assert loopback_only(bootstrap) is loopback


def test_a_broker_off_this_host_without_a_key_is_refused_unless_the_network_is_trusted(monkeypatch):
    for name in ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_SIGNING_KEY_FILE", "TRAINWARDEN_TRUSTED_NETWORK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="refusing to use the Kafka broker at 10.255.255.1:9092 without a "
                                          "signing key") as caught:
        open_bus("10.255.255.1:9092")
    assert "--trusted-network" in caught.value.hint
    assert not isinstance(open_bus("10.255.255.1:9092", trusted_network=True), SigningBus)
    assert not isinstance(open_bus("127.0.0.1:9092"), SigningBus)
    monkeypatch.setenv("TRAINWARDEN_TRUSTED_NETWORK", "1")
    assert not isinstance(open_bus("10.255.255.1:9092"), SigningBus)
    monkeypatch.setenv("TRAINWARDEN_TRUSTED_NETWORK", "maybe")
    with pytest.raises(ConfigError, match="TRAINWARDEN_TRUSTED_NETWORK must be"):
        open_bus("10.255.255.1:9092")
    monkeypatch.setenv("TRAINWARDEN_SIGNING_KEY", SECRET1)
    monkeypatch.setenv("TRAINWARDEN_SIGNING_MAX_AGE", "90")
    bus = open_bus("10.255.255.1:9092", trusted_network=False, service="processor")
    assert isinstance(bus, SigningBus) and bus.config.max_age_s == 90.0 and bus.service == "processor"
    monkeypatch.setenv("TRAINWARDEN_SIGNING_MAX_AGE", "٦٠")  # digits, but not ASCII ones
    with pytest.raises(ConfigError, match="TRAINWARDEN_SIGNING_MAX_AGE"):
        open_bus("memory")
