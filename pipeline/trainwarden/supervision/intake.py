"""The deciding half of supervision, the same for ``trainwarden run`` and the
cluster's processor.

Pure: time comes in as ``now``, and what must be kept -- a dead letter when
the engine raised, a diagnosis row for every C4D finding, trusted or not --
comes out as records for the host to write. A bug in the engine never loses
the event nor leaves the job unsupervised: the event is dead-lettered and the
job fails with ``Reason.ENGINE_ERROR``.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Optional, Union

from trainwarden.diagnose.c4d import C4DFormatError, Finding, parse_line
from trainwarden.engine import JobState, fail_for_engine_error, step
from trainwarden.events import Decision, Diagnosis, Event, LogLine, action_id
from trainwarden.limits import DEAD_LETTER_ERROR_CHARS, DEAD_LETTER_VALUE_CHARS
from trainwarden.store.records import DeadLetter, DiagnosisRecord

MAX_ERROR = DEAD_LETTER_ERROR_CHARS
MAX_PAYLOAD = DEAD_LETTER_VALUE_CHARS

Record = Union[DeadLetter, DiagnosisRecord]


@dataclasses.dataclass(frozen=True)
class Taken:
    state: JobState
    decisions: list[Decision]
    records: list[Record]
    engine_failed: bool = False  # the engine raised: the event was not taken


def take(state: JobState, event: Event, now: float, *, node: str) -> Taken:
    """Step the engine with one event; ``node`` names where a finding printed
    by the job itself was seen (the supervisor's node when it does not say)."""
    records: list[Record] = []
    if isinstance(event, LogLine) and ("C4D" in event.text or "c4d" in event.text):
        found = _finding(event.text)
        if found is not None:
            # Anyone can print this; only the diagnostic channel may act on it.
            records.append(diagnosis_record(
                diagnosis(event.job_id, found, node, event.time), False,
                f"recorded only: printed by {event.instance}, not the C4D channel", now))
    try:
        state, decisions = step(state, event, now)
    except Exception as exc:  # noqa: BLE001 - a bug must not lose the event or leave the job unsupervised
        records.append(dead_letter(state.job_id, "engine", f"engine step failed: {exc!r}",
                                   repr(event) + "\n" + traceback.format_exc(), now))
        state, failed = fail_for_engine_error(state, repr(exc), now)
        return Taken(state, [failed], records, engine_failed=True)
    if isinstance(event, Diagnosis):
        records.append(diagnosis_record(event, True, "+".join(d.kind.value for d in decisions) or "recorded", now))
    return Taken(state, decisions, records)


def channel_line(job_id: str, line: str, node: str, now: float) -> Union[Diagnosis, DeadLetter, None]:
    """A line of the C4D agent's own log (the trusted channel): a finding for
    the engine, a dead letter when it is malformed, None when it says nothing."""
    found = read_channel_line(line, now, job_id)
    return diagnosis(job_id, found, node, now) if isinstance(found, Finding) else found


def read_channel_line(line: str, now: float, job_id: str = "") -> Union[Finding, DeadLetter, None]:
    """A line of the trusted channel, before it is known which jobs it
    concerns (a node agent's: every job with instances there, unless it names one)."""
    try:
        return parse_line(line)
    except C4DFormatError as exc:
        return dead_letter(job_id, "c4d", str(exc), line, now)


def refused_request(job_id: str, reason: str, raw: bytes, now: float) -> DeadLetter:
    """An SDK request the control endpoint refused (bad token, bad frame, too big)."""
    return dead_letter(job_id, "sdk", reason, raw.decode("utf-8", errors="replace"), now)


def dead_letter(job_id: str, source: str, error: str, payload: str, now: float) -> DeadLetter:
    """Every refused input of the supervision, bounded the same wherever it was refused."""
    return DeadLetter(time=now, source=source, job_id=job_id, error=error[:MAX_ERROR], payload=payload[:MAX_PAYLOAD])


def diagnosis(job_id: str, finding: Finding, node: str, when: float) -> Diagnosis:
    return Diagnosis(job_id=job_id, time=when, node=finding.node or node, source="c4d", kind=finding.kind,
                     level=finding.level, rank=finding.rank, detail=finding.detail)


def diagnosis_record(event: Diagnosis, trusted: bool, action: str, now: float) -> DiagnosisRecord:
    return DiagnosisRecord(
        diagnosis_id=action_id(event.job_id, "diagnosis", event.time, event.node, event.kind, event.level, trusted),
        job_id=event.job_id, time=event.time, node_name=event.node, source=event.source, kind=event.kind,
        level=event.level, rank=event.rank, detail=event.detail, trusted=trusted, action=action, updated_at=now)


def _finding(text: str) -> Optional[Finding]:
    try:
        return parse_line(text)
    except C4DFormatError:
        return None
