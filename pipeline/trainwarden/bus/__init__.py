"""Transports behind one small interface, chosen by one explicit registry:

    memory            the in-process bus (embedded mode, tests)
    HOST:PORT[,...]   Apache Kafka (also kafka://HOST:PORT)

With a signing key configured, the transport is wrapped so that every message
is signed and verified (bus/signing.py); without one, a broker that is not on
this host is refused unless the network is declared trusted.
"""

from __future__ import annotations

import os
from typing import Callable

from trainwarden.bus.base import (
    ACTUATOR_STATE,
    ALL_TOPICS,
    COMMANDS,
    COMPACTED_TOPICS,
    DEAD_LETTERS,
    DECISIONS,
    EVENTS,
    LOGS,
    MARKET,
    NODES,
    PREFIX,
    Bus,
    BusError,
    Message,
    TopicSpec,
)

__all__ = ["ACTUATOR_STATE", "ALL_TOPICS", "PREFIX", "COMMANDS", "DEAD_LETTERS", "DECISIONS", "EVENTS", "LOGS", "MARKET",
           "NODES",
           "Bus", "BusError", "Message", "TopicSpec", "open_bus", "register_transport", "topic_specs"]


def _memory(target: str) -> Bus:
    from trainwarden.bus.memory import MemoryBus

    return MemoryBus()


def _kafka(target: str) -> Bus:
    from trainwarden.bus.kafka import KafkaBus

    return KafkaBus(target.removeprefix("kafka://"))


_TRANSPORTS: dict[str, Callable[[str], Bus]] = {"memory": _memory, "kafka": _kafka}


def register_transport(scheme: str, factory: Callable[[str], Bus]) -> None:
    _TRANSPORTS[scheme] = factory


def open_bus(target: str | None = None, *, key_file: str | None = None, trusted_network: bool | None = None,
             max_age_s: float | None = None, service: str = "trainwarden",
             accept_unsigned_logs: bool | None = None) -> Bus:
    """``memory``, ``kafka://HOST:PORT`` or ``HOST:PORT`` (default: $TRAINWARDEN_KAFKA).

    Signed when a key is configured (``key_file``, else the environment:
    $TRAINWARDEN_SIGNING_KEY_FILE or $TRAINWARDEN_SIGNING_KEY); ``service``
    names the dead letters of refused messages. ``trusted_network`` and
    ``max_age_s`` default to $TRAINWARDEN_TRUSTED_NETWORK and
    $TRAINWARDEN_SIGNING_MAX_AGE, ``accept_unsigned_logs`` (unsigned log
    lines, for Vector) to $TRAINWARDEN_ACCEPT_UNSIGNED_LOGS. Raises
    ConfigError for a bad key or a refused network, BusError for an unknown
    bus."""
    from trainwarden import hardening
    from trainwarden.bus import signing

    target = target or os.environ.get("TRAINWARDEN_KAFKA", "")
    if not target:
        raise BusError("no Kafka bootstrap server given.", hint="pass --bootstrap HOST:PORT or set TRAINWARDEN_KAFKA")
    scheme = target.split("://", 1)[0] if "://" in target else ("memory" if target == "memory" else "kafka")
    if scheme not in _TRANSPORTS:
        raise BusError(f"unknown bus {target!r}.", hint=f"use one of: {', '.join(_TRANSPORTS)}, or HOST:PORT")
    # A secret variable taken out of the environment at the start (hardening.py) is still the operator's key.
    keyring = signing.keyring_from({**os.environ, **hardening.secrets()}, key_file)
    if keyring is None:
        trusted = signing.flag(os.environ, signing.ENV_TRUSTED) if trusted_network is None else trusted_network
        if scheme != "memory" and not trusted and not signing.loopback_only(target):
            raise signing.untrusted_network(target)
        return _TRANSPORTS[scheme](target)
    if max_age_s is None:
        max_age_s = _max_age_from_env(signing)
    if accept_unsigned_logs is None:
        accept_unsigned_logs = signing.flag(os.environ, signing.ENV_ACCEPT_UNSIGNED_LOGS)
    config = signing.SigningConfig(keyring, max_age_s, accept_unsigned_logs=accept_unsigned_logs)
    return signing.SigningBus(_TRANSPORTS[scheme](target), config, service)


def _max_age_from_env(signing) -> float:
    text = os.environ.get(signing.ENV_MAX_AGE, "")
    if not text:
        return signing.DEFAULT_MAX_AGE_S
    try:
        return signing.max_age(text)
    except ValueError as exc:
        from trainwarden.yamlsrc import ConfigError

        raise ConfigError(f"${signing.ENV_MAX_AGE}: {exc}", hint="give seconds, e.g. 600") from None


def topic_specs(partitions: int) -> list[TopicSpec]:
    return [TopicSpec(name, 1 if name in (ACTUATOR_STATE, MARKET) else partitions, name in COMPACTED_TOPICS)
            for name in ALL_TOPICS]
