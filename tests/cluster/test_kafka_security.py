"""Kafka locked down: a real broker with a SASL_SSL listener (SCRAM-SHA-512,
certificates made for the run) and ACLs per service, started once for this
module from deploy/kafka/local-kafka (KAFKA_SECURITY=sasl_ssl) on a free port.

Opt in with TRAINWARDEN_TEST_KAFKA_SECURE=1 (.ci/run sets it): these tests
then start and stop a broker of their own (Java 17+, openssl, the jars of
deploy/kafka/lib)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainwarden.bus import BusError, TopicSpec
from trainwarden.bus.base import read_to_end
from trainwarden.bus.serde import SIGNED_PREFIX
from trainwarden.bus.kafka import KafkaBus
from trainwarden.bus.kafka_security import ENV_PREFIX, SETTINGS, KafkaSecurity
from tests.cluster.processes import KAFKA_SCRIPT, ServiceProcesses, behave, free_port, wait_for
from tests.notify.conftest import ENV as NOTIFY_ENV, receiver, subscription_yaml  # noqa: F401 - fixture
from tests.conftest import ROOT, TRAINWARDEN

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

OPT_IN = "TRAINWARDEN_TEST_KAFKA_SECURE"
NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"


class SecureBroker:
    def __init__(self, bootstrap: str, client_env: dict[str, str], secrets: Path, prefix: str, script_env: dict):
        self.bootstrap = bootstrap
        self.client_env = client_env
        self.secrets = secrets
        self.prefix = prefix
        self.script_env = script_env

    def env_of(self, user: str) -> dict[str, str]:
        """The client variables of one of the broker's users."""
        return dict(self.client_env, TRAINWARDEN_KAFKA_SASL_USERNAME=user,
                    TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE=str(self.secrets / f"{user}.password"))

    def bus(self, user: str) -> KafkaBus:
        return KafkaBus(self.bootstrap, security=KafkaSecurity.from_env(self.env_of(user)))

    def password(self, user: str) -> str:
        return (self.secrets / f"{user}.password").read_text().strip()

    def grant(self, prefix: str) -> None:
        subprocess.run([str(KAFKA_SCRIPT), "acls", prefix], env=self.script_env, check=True, capture_output=True,
                       timeout=60)

    def topic(self, kind: str) -> str:
        return f"{self.prefix}.{kind}"


def _ports_free(*ports: int) -> bool:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"set {OPT_IN}=1 to let these tests start a SASL_SSL Kafka broker from deploy/kafka/local-kafka "
                    "(Java 17+, openssl)")
    port = free_port()
    while not _ports_free(port, port + 1):
        port = free_port()
    data = tmp_path_factory.mktemp("secure-kafka")
    prefix = f"twsec{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TRAINWARDEN_"))}
    env.update(KAFKA_SECURITY="sasl_ssl", KAFKA_PORT=str(port), KAFKA_DATA_DIR=str(data / "kafka"),
               KAFKA_TOPIC_PREFIXES=prefix, KAFKA_STOP_TIMEOUT="10")
    started = subprocess.run([str(KAFKA_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stderr[-4000:]
        client_env = {}
        for line in started.stdout.splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                client_env[name] = value
        secrets = Path(client_env["TRAINWARDEN_KAFKA_SSL_CAFILE"]).parent
        client_env = {k: v for k, v in client_env.items() if k != "TRAINWARDEN_KAFKA"}
        secure = SecureBroker(f"127.0.0.1:{port}", client_env, secrets, prefix, env)
        admin = secure.bus("admin")
        admin.create_topics([TopicSpec(secure.topic(kind), 1) for kind in
                             ("logs", "events", "decisions", "commands", "nodes", "actuator", "deadletter")])
        yield secure
    finally:
        subprocess.run([str(KAFKA_SCRIPT), "stop", "--wipe"], env=env, capture_output=True, timeout=120)


def _no_security_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_KAFKA_")}


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full = dict(_no_security_env(), PYTHONPATH=str(ROOT / "pipeline"), **env)
    return subprocess.run([*TRAINWARDEN, *args], env=full, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# ------------------------------------------------------------ the services


class SecureServices(ServiceProcesses):
    """The services, each logged in as its own user of the broker: `kafka
    init` as the admin, submit as the CLI's user. The ACLs of this run's
    topic prefix are granted before the first service starts."""

    def __init__(self, broker: SecureBroker, tmp: Path):
        self.broker = broker
        self._granted = False
        super().__init__(broker.bootstrap, tmp)

    @contextmanager
    def _as(self, user: str):
        if not self._granted:
            self.broker.grant(self.topic_prefix)
            self._granted = True
        saved = self.env
        self.env = dict(saved, **self.broker.env_of(user))
        try:
            yield
        finally:
            self.env = saved

    def start(self, name: str, *extra: str):
        with self._as(name):
            return super().start(name, *extra)

    def start_agent(self, node: str):
        with self._as("agent"):
            return super().start_agent(node)

    def submit(self, *args: str, timeout: float = 180):
        with self._as("cli"):
            return super().submit(*args, timeout=timeout)


@pytest.fixture
def secure_services(broker, tmp_path, monkeypatch):
    for name, value in broker.env_of("admin").items():
        monkeypatch.setenv(name, value)
    # The locked-down form of the manifests: the services also sign what they produce.
    keyring = tmp_path / "signing.keyring"
    keyring.write_text(f"k1 {uuid.uuid4().hex}{uuid.uuid4().hex}\n")
    keyring.chmod(0o600)
    monkeypatch.setenv("TRAINWARDEN_SIGNING_KEY_FILE", str(keyring))
    services = SecureServices(broker, tmp_path)
    yield services
    services.stop()


def test_with_sasl_ssl_acls_and_signing_the_services_run_a_job_through_a_crash_to_its_end(
        secure_services, job_id, broker, tmp_path, receiver):
    services = secure_services
    hook = receiver()
    (tmp_path / "subscriptions").mkdir()
    (tmp_path / "subscriptions" / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", hook.url, private=True))
    services.env.update(NOTIFY_ENV)
    services.start("notifier", "--notifications", str(tmp_path / "subscriptions"), "--notify-dir",
                   str(tmp_path / "notify-queue"), "--store", str(services.store))
    proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--",
                           *behave("--steps", "30", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0",
                                   "--fail-at-step", "5", "--fail-message", NCCL))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    done = [r for r in services.history(job_id) if r["result"] == "done"]
    assert [(r["action"], r["round"]) for r in done] == [("restart_job", 0)], done
    assert out.count("hello worker-0") == 2  # rounds 0 and 1

    def delivered() -> list[str]:
        return list(dict.fromkeys(json.loads(r.body)["type"] for r in hook.requests))

    wait_for(lambda: "job.succeeded" in delivered(), 60, "the notifier's job.succeeded")
    assert delivered() == ["job.restarted", "job.succeeded"], delivered()
    # What made things happen went through signed.
    for kind in ("commands", "decisions"):
        consumer = broker.bus("admin").consumer([services.topic(kind)], None, from_beginning=True)
        try:
            records = read_to_end(consumer)
        finally:
            consumer.close()
        assert records and all(r.value.startswith(SIGNED_PREFIX) for r in records), kind
    assert all(services.alive().values()), services.alive()
    logs = services.logs()
    assert "does not let" not in logs and "refused the SASL" not in logs, logs
    for user in ("admin", "processor", "actuator", "agent", "notifier", "cli"):
        assert broker.password(user) not in logs + out + err


class MarketUnreadable(SecureServices):
    """The services of a site that granted the processor everything but Read
    on the market topic (an older ACL set, or a typo in it)."""

    def _as(self, user: str):
        if not self._granted:
            self.broker.grant(self.topic_prefix)
            _take_back(self.broker, "User:processor", f"{self.topic_prefix}.market")
            self._granted = True
        return super()._as(user)


def _take_back(broker: SecureBroker, principal: str, topic: str) -> None:
    import importlib.util

    from kafka import KafkaAdminClient

    spec = importlib.util.spec_from_file_location("local_kafka_acls", ROOT / "deploy" / "kafka" / "acls.py")
    acls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(acls)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="twtest-acls", request_timeout_ms=15000,
                             **acls.client_options(str(broker.secrets)))
    try:
        prefix = topic.rsplit(".", 1)[0]
        taken = [a for a in acls.acls_for(prefix) if a.principal == principal
                 and a.resource_pattern.resource_name == topic]
        assert taken, (principal, topic)
        admin.delete_acls(taken)
    finally:
        admin.close()


def test_a_processor_refused_read_on_the_market_topic_still_runs_every_other_job_to_its_end(
        broker, tmp_path, job_id, monkeypatch):
    # The Kafka client retries a refused topic for its whole request timeout
    # (30 s): looked up on the processor's own loop, that stalled every job.
    for name, value in broker.env_of("admin").items():
        monkeypatch.setenv(name, value)
    services = MarketUnreadable(broker, tmp_path)
    try:
        began = time.monotonic()
        proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--",
                               *behave("--steps", "10", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0",
                                       "--fail-at-step", "3", "--fail-message", NCCL))
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the job did not end within 120 s\n" + services.logs()) from None
        took = time.monotonic() - began
        assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
        assert took < 30, f"the job took {took:.1f} s: its processor's turns waited for the market topic"
        assert "spot jobs wait for prices (every other job goes on)" in (tmp_path / "processor.log").read_text()
    finally:
        services.stop()


# ------------------------------------------------------------- the ACLs


@pytest.mark.parametrize("kind", ["commands", "decisions", "actuator"])
def test_an_agents_credentials_cannot_produce_to_the_topics_that_make_things_happen(broker, kind):
    producer = broker.bus("agent").producer()
    try:
        producer.send(broker.topic("events"), "job", b"{}")  # what an agent may write goes through
        producer.flush(30)
        started = time.monotonic()
        producer.send(broker.topic(kind), "node-1", b'{"forged": true}')
        with pytest.raises(BusError) as refused:
            producer.flush(30)
    finally:
        producer.close()
    assert f"does not let user agent write to the topic {broker.topic(kind)} (TopicAuthorizationFailedError)" in str(
        refused.value)
    assert "ACL" in refused.value.hint and time.monotonic() - started < 30


def test_only_the_actuator_may_write_commands_and_only_the_processor_decisions(broker):
    for user, kind in (("actuator", "commands"), ("processor", "decisions")):
        producer = broker.bus(user).producer()
        try:
            producer.send(broker.topic(kind), "key", b"{}")
            producer.flush(30)
        finally:
            producer.close()
    producer = broker.bus("processor").producer()
    try:
        producer.send(broker.topic("commands"), "node-1", b"{}")
        with pytest.raises(BusError, match="does not let user processor write"):
            producer.flush(30)
    finally:
        producer.close()


def test_an_agents_credentials_cannot_create_topics_or_read_decisions(broker):
    out = _cli("kafka", "init", "--bootstrap", broker.bootstrap, env=dict(
        broker.env_of("agent"), TRAINWARDEN_TOPIC_PREFIX=f"twother{uuid.uuid4().hex[:4]}"))
    assert out.returncode == 1 and "does not let user agent create the topics" in out.stderr, out.stderr
    consumer_refused = None
    try:
        broker.bus("agent").consumer([broker.topic("decisions")], None)
    except BusError as exc:
        consumer_refused = exc
    assert consumer_refused is not None and "may not read it" in str(consumer_refused)


# --------------------------------------------------------------- logins


def test_a_wrong_password_gives_one_sentence_naming_the_user_and_never_the_password(broker, tmp_path):
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password-Zq81\n")
    env = dict(broker.env_of("agent"), TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE=str(wrong))
    started = time.monotonic()
    out = _cli("nodes", "--bootstrap", broker.bootstrap, env=env)
    assert out.returncode == 1, out.stderr
    first = out.stderr.splitlines()[0]
    assert first == (f"trainwarden: error: Kafka at {broker.bootstrap} refused the SASL login of user agent "
                     "(SCRAM-SHA-512)."), out.stderr
    assert "hint:" in out.stderr and "Traceback" not in out.stderr
    assert "not-the-password-Zq81" not in out.stdout + out.stderr
    assert broker.password("agent") not in out.stdout + out.stderr
    assert time.monotonic() - started < 45


def test_a_service_with_a_wrong_password_given_as_a_variable_exits_saying_so(broker, tmp_path):
    env = dict(broker.env_of("agent"), TRAINWARDEN_KAFKA_SASL_PASSWORD="wrong-Pw-4471")
    del env["TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE"]
    out = _cli("agent", "--node", "n-wrong", "--bootstrap", broker.bootstrap, "--log-dir", str(tmp_path / "logs"),
               env=env)
    assert out.returncode == 1 and "refused the SASL login of user agent" in out.stderr, out.stderr
    assert "$TRAINWARDEN_KAFKA_SASL_PASSWORD" in out.stderr and "wrong-Pw-4471" not in out.stdout + out.stderr


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_the_other_sasl_mechanisms_log_in_too(broker, mechanism):
    env = dict(broker.env_of("cli"), TRAINWARDEN_KAFKA_SASL_MECHANISM=mechanism)
    bus = KafkaBus(broker.bootstrap, security=KafkaSecurity.from_env(env))
    consumer = bus.consumer([broker.topic("nodes")], None)
    consumer.close()


def test_a_plaintext_client_is_told_the_listener_speaks_another_protocol_within_seconds(broker):
    started = time.monotonic()
    out = _cli("nodes", "--bootstrap", broker.bootstrap, env={}, timeout=60)
    assert out.returncode == 1, out.stderr
    assert (f"Kafka at {broker.bootstrap} closed the connection before answering: its listener expects another "
            "security protocol than PLAINTEXT.") in out.stderr
    assert "TRAINWARDEN_KAFKA_SECURITY_PROTOCOL (--kafka-security-protocol)" in out.stderr
    assert time.monotonic() - started < 30
    with pytest.raises(BusError, match="closed the connection before answering"):
        KafkaBus(broker.bootstrap, security=KafkaSecurity.from_env({})).producer()


def test_a_broker_certificate_signed_by_an_unknown_ca_is_refused(broker, tmp_path):
    other = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(tmp_path / "other.key"), "-out", str(other), "-days", "1", "-subj", "/CN=other"],
                   check=True, capture_output=True, timeout=30)
    env = dict(broker.env_of("cli"), TRAINWARDEN_KAFKA_SSL_CAFILE=str(other))
    out = _cli("nodes", "--bootstrap", broker.bootstrap, env=env)
    assert out.returncode == 1 and "presented a TLS certificate this client does not trust" in out.stderr, out.stderr
    assert "--kafka-ssl-cafile" in out.stderr


def test_the_flags_alone_log_a_command_in(broker):
    """Every setting from the command line, none from the environment."""
    flags = []
    for name, value in broker.env_of("cli").items():
        flags += [SETTINGS[name.removeprefix(ENV_PREFIX)], value]
    out = _cli("nodes", "--bootstrap", broker.bootstrap, "--listen", "0.5", *flags,
               env={"TRAINWARDEN_TOPIC_PREFIX": broker.prefix})
    assert out.returncode == 0, out.stderr


def test_the_kafka_clients_debug_log_shows_the_configuration_without_the_password(broker, tmp_path):
    debug = tmp_path / "kafka-debug.log"
    out = _cli("kafka", "init", "--bootstrap", broker.bootstrap, env=dict(
        broker.env_of("admin"), TRAINWARDEN_TOPIC_PREFIX=broker.prefix, TRAINWARDEN_KAFKA_DEBUG=str(debug)))
    assert out.returncode == 0, out.stderr
    text = debug.read_text()
    assert "'sasl_plain_password': '***'" in text  # the admin client logs its configuration
    assert broker.password("admin") not in text + out.stdout + out.stderr


def _client_certificate(directory: Path, ca: Path, ca_key: Path, name: str) -> tuple[Path, Path]:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"],
                   check=True, capture_output=True, timeout=30)
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                    "-CAcreateserial", "-out", str(cert), "-days", "1"], check=True, capture_output=True, timeout=30)
    return cert, key


def test_a_client_certificate_is_presented_and_one_the_broker_does_not_trust_is_refused(broker, tmp_path):
    trusted = _client_certificate(tmp_path, broker.secrets / "ca.pem", broker.secrets / "ca.key", "trusted")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(tmp_path / "rogue-ca.key"), "-out", str(tmp_path / "rogue-ca.pem"), "-days", "1",
                    "-subj", "/CN=rogue CA"], check=True, capture_output=True, timeout=30)
    rogue = _client_certificate(tmp_path, tmp_path / "rogue-ca.pem", tmp_path / "rogue-ca.key", "rogue")
    results = {}
    for name, (cert, key) in (("trusted", trusted), ("rogue", rogue)):
        results[name] = _cli("nodes", "--bootstrap", broker.bootstrap, "--listen", "0.5", "--kafka-ssl-certfile",
                             str(cert), "--kafka-ssl-keyfile", str(key),
                             env=dict(broker.env_of("cli"), TRAINWARDEN_TOPIC_PREFIX=broker.prefix))
    assert results["trusted"].returncode == 0, results["trusted"].stderr
    assert results["rogue"].returncode == 1, results["rogue"].stderr
    assert f"Kafka at {broker.bootstrap}" in results["rogue"].stderr, results["rogue"].stderr
    assert "TLS handshake" in results["rogue"].stderr and "Traceback" not in results["rogue"].stderr
