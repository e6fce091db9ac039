"""Transports behind one small interface, chosen by one explicit registry:

    memory            the in-process bus (embedded mode, tests)
    HOST:PORT[,...]   Apache Kafka (also kafka://HOST:PORT)
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
    NODES,
    PREFIX,
    Bus,
    BusError,
    Message,
    TopicSpec,
)

__all__ = ["ACTUATOR_STATE", "ALL_TOPICS", "PREFIX", "COMMANDS", "DEAD_LETTERS", "DECISIONS", "EVENTS", "LOGS", "NODES",
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


def open_bus(target: str | None = None) -> Bus:
    """``memory``, ``kafka://HOST:PORT`` or ``HOST:PORT`` (default: $TRAINWARDEN_KAFKA)."""
    target = target or os.environ.get("TRAINWARDEN_KAFKA", "")
    if not target:
        raise BusError("no Kafka bootstrap server given.", hint="pass --bootstrap HOST:PORT or set TRAINWARDEN_KAFKA")
    scheme = target.split("://", 1)[0] if "://" in target else ("memory" if target == "memory" else "kafka")
    if scheme not in _TRANSPORTS:
        raise BusError(f"unknown bus {target!r}.", hint=f"use one of: {', '.join(_TRANSPORTS)}, or HOST:PORT")
    return _TRANSPORTS[scheme](target)


def topic_specs(partitions: int) -> list[TopicSpec]:
    return [TopicSpec(name, 1 if name in (ACTUATOR_STATE,) else partitions, name in COMPACTED_TOPICS)
            for name in ALL_TOPICS]
