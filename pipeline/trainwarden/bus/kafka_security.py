"""How the Kafka clients authenticate: TLS and SASL settings from the
environment, checked strictly before any client is made.

    TRAINWARDEN_KAFKA_SECURITY_PROTOCOL      PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
    TRAINWARDEN_KAFKA_SASL_MECHANISM         PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    TRAINWARDEN_KAFKA_SASL_USERNAME
    TRAINWARDEN_KAFKA_SASL_PASSWORD          or ..._PASSWORD_FILE (preferred: a variable is
                                             inherited by every child process)
    TRAINWARDEN_KAFKA_SSL_CAFILE             PEM CA bundle that signed the broker's certificate
    TRAINWARDEN_KAFKA_SSL_CERTFILE           client certificate (PEM), with ..._KEYFILE
    TRAINWARDEN_KAFKA_SSL_KEYFILE
    TRAINWARDEN_KAFKA_SSL_KEY_PASSWORD_FILE  when the client key is encrypted

The CLI's flags (--kafka-security-protocol, ...) override the variables
through ``set_by_flag``, without entering the process's environment: an
agent's environment is that of every instance it starts. Passwords are held in ``Secret``, whose
repr and str never show them; no error names a password, only its source.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from typing import Mapping

from trainwarden import hardening
from trainwarden.bus.base import BusError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# A password file is a secret of a few dozen bytes; anything larger is the wrong file.
MAX_SECRET_BYTES = 4096

ENV_PREFIX = "TRAINWARDEN_KAFKA_"
# Each setting's variable and the flag that sets it (None: no flag, a flag's value shows in `ps`).
SETTINGS = {
    "SECURITY_PROTOCOL": "--kafka-security-protocol",
    "SASL_MECHANISM": "--kafka-sasl-mechanism",
    "SASL_USERNAME": "--kafka-sasl-username",
    "SASL_PASSWORD": None,
    "SASL_PASSWORD_FILE": "--kafka-sasl-password-file",
    "SSL_CAFILE": "--kafka-ssl-cafile",
    "SSL_CERTFILE": "--kafka-ssl-certfile",
    "SSL_KEYFILE": "--kafka-ssl-keyfile",
    "SSL_KEY_PASSWORD_FILE": "--kafka-ssl-key-password-file",
}


# What the command line gave, by setting; see set_by_flag.
_FLAG_VALUES: dict[str, str] = {}


def set_by_flag(setting: str, value: str) -> None:
    """A flag's value for ``from_env()``, over its variable (the CLI calls it while parsing)."""
    if setting not in SETTINGS or SETTINGS[setting] is None:
        raise ValueError(f"no flag sets {setting}")
    _FLAG_VALUES[setting] = value


def source(setting: str) -> str:
    """How a user names a setting: its variable, and its flag if it has one."""
    flag = SETTINGS[setting]
    return ENV_PREFIX + setting + (f" ({flag})" if flag else "")


class KafkaSecurityError(BusError):
    """A security setting that cannot work; names the variable (and flag) to fix."""


class Secret:
    """A password that no repr, str or format shows."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


@dataclasses.dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: Secret = dataclasses.field(default_factory=lambda: Secret(""))
    # Where the password came from, for messages: a variable or a file, never the value.
    password_source: str = ""
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    key_password: Secret = dataclasses.field(default_factory=lambda: Secret(""))

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def describe(self) -> str:
        """For messages: the protocol, the mechanism and the user, never a password."""
        if self.sasl:
            return f"{self.protocol}, {self.mechanism} as user {self.username}"
        return self.protocol

    def client_options(self) -> dict:
        """kafka-python's settings (the same names for producer, consumer,
        admin client and a bare BrokerConnection)."""
        options: dict = {"security_protocol": self.protocol}
        if self.sasl:
            options.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                           sasl_plain_password=self.password.reveal())
        if self.tls:
            # Always verified: a broker whose name does not match its certificate is refused.
            options["ssl_check_hostname"] = True
            if self.cafile:
                options["ssl_cafile"] = self.cafile
            if self.certfile:
                options.update(ssl_certfile=self.certfile, ssl_keyfile=self.keyfile)
                if self.key_password:
                    options["ssl_password"] = self.key_password.reveal()
        return options

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KafkaSecurity":
        """From ``environ``; by default this process's environment with the flags given over it."""
        if environ is None:
            # With the secret variables a service took out of its environment at the start (hardening.py).
            env = {**os.environ, **hardening.secrets(),
                   **{ENV_PREFIX + setting: value for setting, value in _FLAG_VALUES.items()}}
        else:
            env = environ

        def get(setting: str) -> str:
            return env.get(ENV_PREFIX + setting, "").strip()

        protocol = get("SECURITY_PROTOCOL").upper() or "PLAINTEXT"
        if protocol not in PROTOCOLS:
            raise KafkaSecurityError(
                f"{source('SECURITY_PROTOCOL')} is {get('SECURITY_PROTOCOL')!r}, not a Kafka security protocol.",
                hint=f"use one of {', '.join(PROTOCOLS)}")
        sasl = protocol.startswith("SASL_")
        tls = protocol in ("SSL", "SASL_SSL")
        mechanism = get("SASL_MECHANISM").upper()
        username = get("SASL_USERNAME")
        given_password = env.get(ENV_PREFIX + "SASL_PASSWORD", "")
        password_file = get("SASL_PASSWORD_FILE")

        sasl_settings = [s for s, v in (("SASL_MECHANISM", mechanism), ("SASL_USERNAME", username),
                                        ("SASL_PASSWORD", given_password), ("SASL_PASSWORD_FILE", password_file))
                         if v]
        if not sasl and sasl_settings:
            raise KafkaSecurityError(
                f"{source(sasl_settings[0])} is set, but the security protocol is {protocol}, which has no SASL login.",
                hint=f"set {source('SECURITY_PROTOCOL')} to SASL_SSL (or SASL_PLAINTEXT), or unset it")
        password = Secret("")
        password_source = ""
        if sasl:
            if not mechanism:
                raise KafkaSecurityError(f"the security protocol {protocol} needs a SASL mechanism.",
                                         hint=f"set {source('SASL_MECHANISM')} to one of {', '.join(MECHANISMS)}")
            if mechanism not in MECHANISMS:
                raise KafkaSecurityError(
                    f"{source('SASL_MECHANISM')} is {get('SASL_MECHANISM')!r}, not a supported SASL mechanism.",
                    hint=f"use one of {', '.join(MECHANISMS)}")
            if not username:
                raise KafkaSecurityError(f"the SASL mechanism {mechanism} needs a user name.",
                                         hint=f"set {source('SASL_USERNAME')}")
            if given_password and password_file:
                raise KafkaSecurityError(
                    f"the SASL password is given twice, by {ENV_PREFIX}SASL_PASSWORD and by "
                    f"{source('SASL_PASSWORD_FILE')}.", hint="keep one of them (the file is safer)")
            if password_file:
                password = Secret(_read_secret(password_file, "SASL_PASSWORD_FILE"))
                password_source = f"the file {password_file}"
            elif given_password:
                password = Secret(given_password)
                password_source = f"${ENV_PREFIX}SASL_PASSWORD"
            else:
                raise KafkaSecurityError(f"the SASL login of user {username} needs a password.",
                                         hint=f"set {source('SASL_PASSWORD_FILE')} to a file holding it")

        cafile, certfile, keyfile = get("SSL_CAFILE"), get("SSL_CERTFILE"), get("SSL_KEYFILE")
        key_password_file = get("SSL_KEY_PASSWORD_FILE")
        tls_settings = [s for s, v in (("SSL_CAFILE", cafile), ("SSL_CERTFILE", certfile), ("SSL_KEYFILE", keyfile),
                                       ("SSL_KEY_PASSWORD_FILE", key_password_file)) if v]
        if not tls and tls_settings:
            raise KafkaSecurityError(
                f"{source(tls_settings[0])} is set, but the security protocol is {protocol}, which has no TLS.",
                hint=f"set {source('SECURITY_PROTOCOL')} to SSL or SASL_SSL, or unset it")
        key_password = Secret("")
        if tls:
            if cafile:
                _check_ca(cafile)
            if bool(certfile) != bool(keyfile):
                given, missing = ("SSL_CERTFILE", "SSL_KEYFILE") if certfile else ("SSL_KEYFILE", "SSL_CERTFILE")
                raise KafkaSecurityError(f"{source(given)} is set without {source(missing)}.",
                                         hint="a client certificate needs its private key: give both, or neither")
            if key_password_file and not keyfile:
                raise KafkaSecurityError(f"{source('SSL_KEY_PASSWORD_FILE')} is set without a client key.",
                                         hint=f"set {source('SSL_KEYFILE')} and {source('SSL_CERTFILE')}, or unset it")
            if key_password_file:
                key_password = Secret(_read_secret(key_password_file, "SSL_KEY_PASSWORD_FILE"))
            if certfile:
                _check_client_certificate(certfile, keyfile, key_password)
        return cls(protocol=protocol, mechanism=mechanism if sasl else "", username=username if sasl else "",
                   password=password, password_source=password_source, cafile=cafile, certfile=certfile,
                   keyfile=keyfile, key_password=key_password)


def _readable(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SECRET_BYTES * 64 + 1)
    except OSError as exc:
        raise KafkaSecurityError(f"{source(setting)} names {path}, which cannot be read: "
                                 f"{exc.strerror or type(exc).__name__}.",
                                 hint="give a readable file (mounted from a Secret in Kubernetes)") from None


def _read_secret(path: str, setting: str) -> str:
    data = _readable(path, setting)
    if len(data) > MAX_SECRET_BYTES:
        raise KafkaSecurityError(f"{source(setting)} names {path}, which is larger than {MAX_SECRET_BYTES} bytes.",
                                 hint="the file must hold the password alone")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KafkaSecurityError(f"{source(setting)} names {path}, which is not UTF-8 text.",
                                 hint="the file must hold the password alone") from None
    # Files written by `echo` or editors end in a newline that is not part of the password.
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise KafkaSecurityError(f"{source(setting)} names {path}, which is empty.",
                                 hint="write the password into it")
    return text


def _check_ca(path: str) -> None:
    _readable(path, "SSL_CAFILE")
    try:
        ssl.create_default_context().load_verify_locations(cafile=path)
    except (ssl.SSLError, ValueError) as exc:
        raise KafkaSecurityError(f"{source('SSL_CAFILE')} names {path}, which holds no PEM CA certificate "
                                 f"({exc.__class__.__name__}).",
                                 hint="give the PEM file of the CA that signed the broker's certificate") from None


def _check_client_certificate(certfile: str, keyfile: str, key_password: Secret) -> None:
    _readable(certfile, "SSL_CERTFILE")
    _readable(keyfile, "SSL_KEYFILE")
    try:
        # A wrong key password must fail here, not prompt on a terminal.
        ssl.create_default_context().load_cert_chain(certfile, keyfile, password=key_password.reveal() or "")
    except (ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc.__class__.__name__
        raise KafkaSecurityError(
            f"the client certificate {certfile} and key {keyfile} do not load together ({reason}).",
            hint=f"check {source('SSL_CERTFILE')}, {source('SSL_KEYFILE')} and, for an encrypted key, "
                 f"{source('SSL_KEY_PASSWORD_FILE')}") from None
