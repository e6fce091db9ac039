"""Wire format of every bus message: JSON objects with a schema version ``v``
and a ``type`` tag (docs/MESSAGES.md). Decoding never raises anything but
DecodeError, whose reason goes to the dead-letter topic.
"""

from __future__ import annotations

from typing import Union

import msgspec

from trainwarden.bus.base import ACTUATOR_STATE, COMMANDS, DEAD_LETTERS, DECISIONS, EVENTS, LOGS, MARKET, NODES
from trainwarden.bus.messages import (
    ActionDone,
    ActionIntent,
    DeadLetterMessage,
    DecisionRecord,
    ExpectTasks,
    Heartbeat,
    LogBatch,
    MarketQuote,
    NodeLogBatch,
    NodeState,
    Recorded,
    StackDumps,
    StackReportReady,
    StartInstance,
    StartInstances,
    StopInstances,
    WireLogLine,
)
from trainwarden.events import (
    Decision,
    Diagnosis,
    InstanceActivity,
    InstanceExited,
    InstanceStarted,
    JobSubmitted,
    MarketUpdate,
    NodeLost,
    Preempted,
    SdkMessage,
)
from trainwarden.limits import DEAD_LETTER_ERROR_CHARS, DEAD_LETTER_VALUE_CHARS

SCHEMA_VERSION = 1
# Far above any message we produce (log lines are cut at 16 KiB and batched),
# below the broker's 16 MiB: anything larger is refused before decoding.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# How every signed envelope begins (bus/signing.py); a consumer without a key
# meets it only when the producers have one and it does not.
SIGNED_PREFIX = b'{"tw_signed":1,'

EventMessage = Union[JobSubmitted, InstanceStarted, InstanceExited, SdkMessage, InstanceActivity, NodeLost, Diagnosis,
                     Preempted, DecisionRecord, MarketUpdate]
LogMessage = Union[NodeLogBatch, LogBatch, WireLogLine]
CommandMessage = Union[StartInstance, StartInstances, StopInstances, ExpectTasks]
ActuatorStateMessage = Union[ActionIntent, ActionDone, NodeState, StackReportReady]
NodeMessage = Union[Heartbeat, StackDumps]


class DecodeError(ValueError):
    pass


class _Header(msgspec.Struct):
    v: int = 0


class _DecisionEnvelope(msgspec.Struct, tag="decision"):
    decision: Decision


_header = msgspec.json.Decoder(_Header)
_decoders = {
    EVENTS: msgspec.json.Decoder(EventMessage),
    LOGS: msgspec.json.Decoder(LogMessage),
    COMMANDS: msgspec.json.Decoder(CommandMessage),
    DECISIONS: msgspec.json.Decoder(Union[_DecisionEnvelope, Recorded]),
    NODES: msgspec.json.Decoder(NodeMessage),
    ACTUATOR_STATE: msgspec.json.Decoder(ActuatorStateMessage),
    DEAD_LETTERS: msgspec.json.Decoder(DeadLetterMessage),
    MARKET: msgspec.json.Decoder(MarketQuote),
}
_encoder = msgspec.json.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    if isinstance(message, Decision):
        message = _DecisionEnvelope(message)
    body = _encoder.encode(message)
    return b'{"v":%d,' % SCHEMA_VERSION + body[1:]


def decode(kind: str, value: bytes) -> msgspec.Struct:
    """Decode a message of one of our topics."""
    if value is None:
        raise DecodeError("the message has no value")
    if len(value) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"the message is {len(value)} bytes; the most is {MAX_MESSAGE_BYTES}")
    if value.startswith(SIGNED_PREFIX):
        raise DecodeError("the message is signed and this service has no signing key to check it; give it the "
                          "producers' key ($TRAINWARDEN_SIGNING_KEY_FILE or $TRAINWARDEN_SIGNING_KEY)")
    try:
        version = _header.decode(value).v
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"not a JSON object: {_short(exc)}") from None
    except RecursionError:
        # msgspec stops cleanly at its recursion limit; a message nested that
        # deep is nobody's, and must not escape as an error of the consumer.
        raise DecodeError("nested too deeply to decode") from None
    if version != SCHEMA_VERSION:
        raise DecodeError(f"schema version {version!r}; this Trainwarden reads version {SCHEMA_VERSION}")
    try:
        message = _decoders[kind].decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(_short(exc)) from None
    except RecursionError:
        raise DecodeError("nested too deeply to decode") from None
    return message.decision if isinstance(message, _DecisionEnvelope) else message


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "…"


def dead_letter(record, service: str, error: str, now: float) -> bytes:
    """The dead-letter message for a bus record that could not take effect:
    where it was, why, and its value (decoded with replacement, bounded)."""
    value = record.value[:DEAD_LETTER_VALUE_CHARS].decode("utf-8", errors="replace") if record.value else ""
    return encode(DeadLetterMessage(time=now, service=service, topic=record.topic, partition=record.partition,
                                    offset=record.offset, key=record.key, error=error[:DEAD_LETTER_ERROR_CHARS],
                                    value=value))
