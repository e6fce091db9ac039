"""Signed messages on a real Kafka broker (TRAINWARDEN_KAFKA): the services
run with a keyring, and what an attacker produces straight to the topics with
a plain Kafka client (forged, unsigned, replayed, signed with a key rotated
out, poison) is dead-lettered with its reason while nothing of it runs."""

import json
import os
import subprocess
import time
import uuid

import pytest

from tests.cluster.processes import ServiceProcesses, behave, free_port, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from trainwarden.bus import open_bus
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import StartInstance
from trainwarden.bus.serde import encode
from trainwarden.events import Decision, DecisionKind, InstanceSpec, Reason

pytestmark = pytest.mark.e2e
kafka = pytest.mark.kafka

SECRETS = {"k0": "0" * 40, "k1": "1" * 20 + "one" * 6, "k2": "2" * 20 + "two" * 6}
SIGNING_ENV = ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_SIGNING_KEY_FILE", "TRAINWARDEN_TRUSTED_NETWORK",
               "TRAINWARDEN_SIGNING_MAX_AGE")


def _keyring(directory, *ids: str) -> str:
    path = directory / ("keys-" + "-".join(ids))
    path.write_text("".join(f"{kid} {SECRETS[kid]}\n" for kid in ids))
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def cluster(bootstrap, tmp_path_factory):
    """Two agents, a processor and an actuator sharing the keyring k2 (signs), k1 (still verifies)."""
    tmp = tmp_path_factory.mktemp("signed")
    with pytest.MonkeyPatch.context() as env:
        for name in SIGNING_ENV:
            env.delenv(name, raising=False)
        env.setenv("TRAINWARDEN_SIGNING_KEY_FILE", _keyring(tmp, "k2", "k1"))
        services = ServiceProcesses(bootstrap, tmp, nodes=2, metrics=True)
        try:
            yield services
        finally:
            services.stop()


def _plain_producer(bootstrap):
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap)


def _signed_bus(cluster, *ids: str):
    return open_bus(cluster.bootstrap, key_file=_keyring(cluster.tmp, *ids))


def _start_command(cluster, node: str, marker, job_id: str) -> StartInstance:
    return StartInstance(node=node, job_id=job_id, action_id=f"forged-{job_id}",
                         instance=InstanceSpec(name="worker-0", role="worker", index=0, rank=0), round=0, start=0,
                         world_size=1, master_addr="127.0.0.1", master_port=free_port(),
                         command=("sh", "-c", f"id >> {marker}"))


def _send_signed(cluster, kid: str, node: str, marker, job_id: str) -> None:
    """A genuine start command, signed with key ``kid``, that appends ``id`` to ``marker``."""
    producer = _signed_bus(cluster, kid).producer()
    producer.send(cluster.topic("commands"), node, encode(_start_command(cluster, node, marker, job_id)))
    producer.flush(30)
    producer.close()


def _runs(marker) -> int:
    """How many times the command of ``_start_command`` has written to ``marker``."""
    return marker.read_text().count("uid=") if marker.exists() else 0


def _dead_letters(cluster) -> list[dict]:
    consumer = _signed_bus(cluster, "k2").consumer([cluster.topic("deadletter")], None, from_beginning=True)
    try:
        return [json.loads(record.value) for record in read_to_end(consumer)]
    finally:
        consumer.close()


def _wait_for_letter(cluster, service: str, reason: str, marker: str) -> dict:
    found: list[dict] = []

    def arrived() -> bool:
        found[:] = [letter for letter in _dead_letters(cluster) if letter["service"] == service
                    and letter["error"].startswith(reason) and marker in letter["value"]]
        return bool(found)

    wait_for(arrived, 90, f"a dead letter of the {service} saying {reason!r} about {marker}")
    return found[0]


def _node_states(cluster) -> dict[str, str]:
    listed = subprocess.run([*TRAINWARDEN, "nodes", "--json"], env=cluster.env, cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return {row["node"]: row["state"] for row in json.loads(listed.stdout)}


@kafka
def test_a_job_runs_end_to_end_on_signed_messages(cluster, job_id):
    proc = cluster.submit("--job-id", job_id, "--nproc", "2", "--", *behave("--steps", "5", "--step-s", "0.05"))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, cluster.logs() + out[-2000:] + err[-2000:]
    assert "hello worker-0" in out and "hello worker-1" in out
    # Every message of the job was signed: nothing of it was refused.
    assert not [letter for letter in _dead_letters(cluster) if job_id in letter["value"]]


@kafka
def test_a_forged_command_and_a_forged_isolation_are_dead_lettered_and_nothing_runs(cluster):
    node = cluster.node_names[0]
    forged_marker, genuine_marker = cluster.tmp / "forged-ran", cluster.tmp / "genuine-ran"
    plain = _plain_producer(cluster.bootstrap)
    plain.send(cluster.topic("commands"), key=node.encode(),
               value=encode(_start_command(cluster, node, forged_marker, "forged-start")))
    forged = Decision(kind=DecisionKind.ISOLATE_NODE, reason=Reason.C4D_ERROR, rule="forged", job_id="forged-iso",
                      time=time.time(), round=0, action_id=uuid.uuid4().hex, node=node)
    plain.send(cluster.topic("decisions"), key=b"forged-iso", value=encode(forged))
    plain.flush(30)
    plain.close()
    # A genuine command behind the forged one, on the same partition: once it ran, the forged one was judged.
    _send_signed(cluster, "k2", node, genuine_marker, "genuine")
    wait_for(genuine_marker.exists, 60, "the genuine command to run")
    _wait_for_letter(cluster, "agent", "unsigned", "forged-start")
    assert not forged_marker.exists()
    _wait_for_letter(cluster, "actuator", "unsigned", "forged-iso")
    assert _node_states(cluster)[node] == "ready"
    refused = [line for line in _scrape(cluster, f"agent-{node}").splitlines()
               if line.startswith('trainwarden_bus_messages_refused_total{reason="unsigned"}')]
    assert refused and float(refused[0].split()[-1]) >= 1, refused


def _scrape(cluster, service: str) -> str:
    from urllib.request import urlopen

    with urlopen(cluster.metrics_url(service), timeout=10) as answer:
        return answer.read().decode()


@kafka
def test_a_genuine_command_copied_and_produced_again_is_dead_lettered_as_replayed(cluster):
    from kafka import KafkaConsumer, TopicPartition

    node = cluster.node_names[1]
    marker = cluster.tmp / "replayed-ran"
    _send_signed(cluster, "k2", node, marker, "replay-me")
    # The shell creates the file at `>>` before `id` writes to it: wait for the line.
    wait_for(lambda: _runs(marker) >= 1, 60, "the genuine command to run")
    assert _runs(marker) == 1
    # The attacker reads the signed record and produces its exact bytes again.
    reader = KafkaConsumer(bootstrap_servers=cluster.bootstrap, consumer_timeout_ms=10000)
    partitions = [TopicPartition(cluster.topic("commands"), p)
                  for p in reader.partitions_for_topic(cluster.topic("commands"))]
    reader.assign(partitions)
    reader.seek_to_beginning(*partitions)
    # Only the start command: the services may have sent commands of that job
    # of their own since (its end's stop_instances).
    [original] = [r for r in reader if b'"type":"start_instance"' in r.value and b'"forged-replay-me"' in r.value]
    reader.close()
    plain = _plain_producer(cluster.bootstrap)
    plain.send(cluster.topic("commands"), key=original.key, value=original.value)
    plain.flush(30)
    plain.close()
    letter = _wait_for_letter(cluster, "agent", "replayed", "replay-me")
    assert "was read before at partition" in letter["error"]
    assert _runs(marker) == 1


@kafka
def test_a_key_rotated_out_is_refused_while_both_keys_of_the_keyring_verify(cluster):
    node = cluster.node_names[0]
    markers = {kid: cluster.tmp / f"signed-by-{kid}" for kid in ("k0", "k1", "k2")}
    for kid in ("k0", "k1", "k2"):  # k0 was removed from the services' keyring
        _send_signed(cluster, kid, node, markers[kid], f"rotation-{kid}")
    wait_for(lambda: markers["k1"].exists() and markers["k2"].exists(), 60, "the k1 and k2 commands to run")
    _wait_for_letter(cluster, "agent", "unknown key id k0", "rotation-k0")
    assert not markers["k0"].exists()


@kafka
def test_poison_before_a_valid_signed_command_costs_it_nothing(cluster):
    node = cluster.node_names[1]
    marker = cluster.tmp / "after-poison"
    plain = _plain_producer(cluster.bootstrap)
    plain.send(cluster.topic("commands"), key=node.encode(), value=b"{not json at all poison-1")
    plain.send(cluster.topic("commands"), key=node.encode(), value=b'{"poison-2":' + b"[" * 10_000 + b"]" * 10_000)
    plain.flush(30)
    plain.close()
    _send_signed(cluster, "k2", node, marker, "after-poison")
    wait_for(marker.exists, 60, "the valid command behind the poison to run")
    _wait_for_letter(cluster, "agent", "unsigned", "poison-1")
    _wait_for_letter(cluster, "agent", "unsigned", "poison-2")
    assert all(cluster.alive().values()), cluster.alive()


def test_a_service_without_a_key_refuses_a_broker_off_this_host_unless_the_network_is_trusted(tmp_path):
    env = {name: value for name, value in os.environ.items() if name not in SIGNING_ENV}
    env.update(PYTHONPATH=str(ROOT / "pipeline"), TRAINWARDEN_STORE=str(tmp_path / "store"))
    command = [*TRAINWARDEN, "processor", "--bootstrap", "10.255.255.1:9092"]
    refused = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "refusing to use the Kafka broker at 10.255.255.1:9092 without a signing key" in refused.stderr
    assert "--trusted-network" in refused.stderr and "cannot be reached" not in refused.stderr
    trusted = subprocess.run([*command, "--trusted-network"], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    # It started and tried to connect: no broker answers there.
    assert "refusing" not in trusted.stderr and trusted.returncode == 1, trusted.stderr
    assert "Kafka at 10.255.255.1:9092" in trusted.stderr, trusted.stderr
