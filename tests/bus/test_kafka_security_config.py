"""The Kafka security settings from the environment: every invalid
combination is refused with one sentence naming the variable (and its flag),
and the password shows nowhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainwarden.bus.kafka import KafkaBus
from trainwarden.bus.kafka_security import KafkaSecurity, KafkaSecurityError, Secret
from tests.conftest import ROOT, TRAINWARDEN

PASSWORD = "s3cret-Pa55word-xyz"
P = "TRAINWARDEN_KAFKA_"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a client certificate it signed with its key, and the same key encrypted."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed: it makes the certificates these tests load")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA")
    openssl("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=client")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "client.pem", "-days", "2")
    (d / "key.password").write_text("keypass\n")
    openssl("pkcs8", "-topk8", "-in", "client.key", "-out", "client-encrypted.key", "-passout", "pass:keypass")
    openssl("req", *ec, "-keyout", "other.key", "-out", "other.csr", "-subj", "/CN=other")
    (d / "not-a-cert.pem").write_text("hello\n")
    return {p.name: p for p in d.iterdir()}


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "kafka.password"
    path.write_text(PASSWORD + "\n")
    return path


def sasl_env(password_file: Path, **more: str) -> dict[str, str]:
    return {P + "SECURITY_PROTOCOL": "SASL_SSL", P + "SASL_MECHANISM": "SCRAM-SHA-512",
            P + "SASL_USERNAME": "agent", P + "SASL_PASSWORD_FILE": str(password_file), **more}


def refused(env: dict[str, str]) -> KafkaSecurityError:
    with pytest.raises(KafkaSecurityError) as caught:
        KafkaSecurity.from_env(env)
    error = caught.value
    assert PASSWORD not in str(error) and PASSWORD not in error.hint
    assert str(error).count(". ") == 0 and str(error).endswith("."), str(error)  # one sentence
    assert error.hint
    return error


def test_nothing_set_means_plaintext_without_credentials():
    security = KafkaSecurity.from_env({})
    assert security.protocol == "PLAINTEXT"
    assert security.client_options() == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_with_a_password_file_gives_every_client_option(password_file, pki):
    security = KafkaSecurity.from_env(sasl_env(password_file, **{P + "SSL_CAFILE": str(pki["ca.pem"])}))
    assert security.client_options() == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "agent",
        "sasl_plain_password": PASSWORD, "ssl_check_hostname": True, "ssl_cafile": str(pki["ca.pem"])}


def test_the_protocol_and_mechanism_may_be_written_in_lower_case(password_file):
    security = KafkaSecurity.from_env(sasl_env(password_file, **{P + "SECURITY_PROTOCOL": "sasl_plaintext",
                                                                 P + "SASL_MECHANISM": "scram-sha-256"}))
    assert (security.protocol, security.mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")


def test_a_client_certificate_and_its_encrypted_key_are_loaded_with_the_key_password(pki):
    security = KafkaSecurity.from_env({
        P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERTFILE": str(pki["client.pem"]),
        P + "SSL_KEYFILE": str(pki["client-encrypted.key"]), P + "SSL_KEY_PASSWORD_FILE": str(pki["key.password"])})
    options = security.client_options()
    assert options["ssl_certfile"] == str(pki["client.pem"]) and options["ssl_password"] == "keypass"


def test_the_password_is_in_no_repr_str_or_format_of_the_settings_or_the_bus(password_file):
    security = KafkaSecurity.from_env(sasl_env(password_file))
    bus = KafkaBus("127.0.0.1:1", security=security)
    for text in (repr(security), str(security), f"{security}", f"{security.password}", repr(bus),
                 security.describe(), security.password_source):
        assert PASSWORD not in text, text
    assert security.password == Secret(PASSWORD) and security.password.reveal() == PASSWORD


def test_an_unknown_protocol_is_refused_naming_the_variable_and_the_flag():
    error = refused({P + "SECURITY_PROTOCOL": "TLS"})
    assert "TRAINWARDEN_KAFKA_SECURITY_PROTOCOL (--kafka-security-protocol)" in str(error)
    assert "SASL_SSL" in error.hint


def test_a_sasl_protocol_without_a_mechanism_is_refused(password_file):
    env = sasl_env(password_file)
    del env[P + "SASL_MECHANISM"]
    assert "--kafka-sasl-mechanism" in refused(env).hint


def test_an_unknown_sasl_mechanism_is_refused(password_file):
    error = refused(sasl_env(password_file, **{P + "SASL_MECHANISM": "GSSAPI"}))
    assert "TRAINWARDEN_KAFKA_SASL_MECHANISM" in str(error) and "SCRAM-SHA-512" in error.hint


def test_a_sasl_mechanism_without_a_username_is_refused(password_file):
    env = sasl_env(password_file)
    del env[P + "SASL_USERNAME"]
    assert "--kafka-sasl-username" in refused(env).hint


def test_a_password_given_both_as_a_variable_and_as_a_file_is_refused(password_file):
    error = refused(sasl_env(password_file, **{P + "SASL_PASSWORD": PASSWORD}))
    assert "TRAINWARDEN_KAFKA_SASL_PASSWORD and by TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE" in str(error)


def test_a_sasl_login_without_any_password_is_refused(password_file):
    env = sasl_env(password_file)
    del env[P + "SASL_PASSWORD_FILE"]
    assert "--kafka-sasl-password-file" in refused(env).hint


def test_an_unreadable_password_file_is_refused_naming_it(tmp_path):
    missing = tmp_path / "nope.password"
    error = refused(sasl_env(missing))
    assert str(missing) in str(error) and "TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE" in str(error)


def test_an_empty_password_file_is_refused(tmp_path):
    empty = tmp_path / "empty.password"
    empty.write_text("\n")
    assert "is empty" in str(refused(sasl_env(empty)))


def test_a_password_file_larger_than_a_secret_is_refused(tmp_path):
    big = tmp_path / "big.password"
    big.write_text(PASSWORD * 1000)
    assert "larger than" in str(refused(sasl_env(big)))


def test_a_password_file_that_is_not_text_is_refused(tmp_path):
    binary = tmp_path / "binary.password"
    binary.write_bytes(b"\xff\xfe\x00pass")
    assert "not UTF-8" in str(refused(sasl_env(binary)))


def test_the_password_variable_is_used_when_no_file_is_given(password_file):
    env = sasl_env(password_file, **{P + "SASL_PASSWORD": PASSWORD})
    del env[P + "SASL_PASSWORD_FILE"]
    security = KafkaSecurity.from_env(env)
    assert security.password.reveal() == PASSWORD and security.password_source == "$TRAINWARDEN_KAFKA_SASL_PASSWORD"


def test_sasl_settings_under_a_protocol_without_sasl_are_refused():
    error = refused({P + "SECURITY_PROTOCOL": "SSL", P + "SASL_USERNAME": "agent"})
    assert "TRAINWARDEN_KAFKA_SASL_USERNAME" in str(error) and "SASL_SSL" in error.hint


def test_a_ca_file_under_plaintext_is_refused(pki):
    error = refused({P + "SSL_CAFILE": str(pki["ca.pem"])})
    assert "TRAINWARDEN_KAFKA_SSL_CAFILE (--kafka-ssl-cafile)" in str(error) and "PLAINTEXT" in str(error)


def test_an_unreadable_ca_file_is_refused(password_file, tmp_path):
    error = refused(sasl_env(password_file, **{P + "SSL_CAFILE": str(tmp_path / "ca.pem")}))
    assert "cannot be read" in str(error) and "--kafka-ssl-cafile" in str(error)


def test_a_ca_file_without_a_certificate_is_refused(password_file, pki):
    error = refused(sasl_env(password_file, **{P + "SSL_CAFILE": str(pki["not-a-cert.pem"])}))
    assert "holds no PEM CA certificate" in str(error)


def test_a_client_certificate_without_its_key_is_refused(pki):
    error = refused({P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERTFILE": str(pki["client.pem"])})
    assert "without TRAINWARDEN_KAFKA_SSL_KEYFILE" in str(error)


def test_a_key_password_file_without_a_key_is_refused(pki):
    error = refused({P + "SECURITY_PROTOCOL": "SSL", P + "SSL_KEY_PASSWORD_FILE": str(pki["key.password"])})
    assert "TRAINWARDEN_KAFKA_SSL_KEY_PASSWORD_FILE" in str(error)


def test_a_client_certificate_with_a_key_of_another_certificate_is_refused(pki):
    error = refused({P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERTFILE": str(pki["client.pem"]),
                     P + "SSL_KEYFILE": str(pki["other.key"])})
    assert "do not load together" in str(error)


def test_an_encrypted_client_key_without_its_password_is_refused(pki):
    error = refused({P + "SECURITY_PROTOCOL": "SSL", P + "SSL_CERTFILE": str(pki["client.pem"]),
                     P + "SSL_KEYFILE": str(pki["client-encrypted.key"])})
    assert "--kafka-ssl-key-password-file" in error.hint


# ------------------------------------------------------------- the CLI


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    full.update(env, PYTHONPATH=str(ROOT / "pipeline"))
    return subprocess.run([*TRAINWARDEN, *args], env=full, capture_output=True, text=True, timeout=60)


def test_the_cli_refuses_a_bad_variable_with_one_sentence_and_exit_1(password_file):
    out = cli("nodes", "--bootstrap", "127.0.0.1:1", env={P + "SECURITY_PROTOCOL": "TLS"})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "TRAINWARDEN_KAFKA_SECURITY_PROTOCOL (--kafka-security-protocol) is 'TLS'" in out.stderr


def test_a_cli_flag_overrides_its_variable(password_file):
    # The variable alone would be refused (no user); the flag's value is checked instead.
    out = cli("nodes", "--bootstrap", "127.0.0.1:1", "--kafka-security-protocol", "PLAINTEXT",
              env=sasl_env(password_file, **{P + "SECURITY_PROTOCOL": "SASL_SSL"}))
    assert "is set, but the security protocol is PLAINTEXT" in out.stderr, out.stderr


def test_the_cli_refuses_an_unknown_protocol_flag_naming_it():
    out = cli("kafka", "init", "--bootstrap", "127.0.0.1:1", "--kafka-security-protocol", "TLS", env={})
    assert out.returncode == 2 and "--kafka-security-protocol" in out.stderr, out.stderr


@pytest.mark.parametrize("form", ["separate", "joined"])
def test_a_password_given_as_a_flag_is_refused_without_repeating_it(form):
    # Not taken for an abbreviation of --kafka-sasl-password-file either.
    args = ["--kafka-sasl-password", PASSWORD] if form == "separate" else [f"--kafka-sasl-password={PASSWORD}"]
    out = cli("agent", *args, env={})
    assert out.returncode == 2 and "--kafka-sasl-password-file" in out.stderr, out.stderr
    assert PASSWORD not in out.stderr + out.stdout


def test_help_shows_no_password_from_the_environment():
    out = cli("agent", "--help", env={P + "SASL_PASSWORD": PASSWORD})
    assert out.returncode == 0 and "--kafka-sasl-password-file" in out.stdout and PASSWORD not in out.stdout


def test_a_flag_overrides_its_variable_without_entering_the_environment_an_agent_passes_on(monkeypatch, pki):
    from trainwarden.bus import kafka_security

    monkeypatch.setattr(kafka_security, "_FLAG_VALUES", {})
    monkeypatch.setenv(P + "SECURITY_PROTOCOL", "PLAINTEXT")
    kafka_security.set_by_flag("SECURITY_PROTOCOL", "SSL")
    kafka_security.set_by_flag("SSL_CAFILE", str(pki["ca.pem"]))
    security = KafkaSecurity.from_env()
    assert (security.protocol, security.cafile) == ("SSL", str(pki["ca.pem"]))
    assert os.environ[P + "SECURITY_PROTOCOL"] == "PLAINTEXT" and P + "SSL_CAFILE" not in os.environ
    with pytest.raises(ValueError):
        kafka_security.set_by_flag("SASL_PASSWORD", PASSWORD)
