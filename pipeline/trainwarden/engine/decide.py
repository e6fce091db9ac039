"""Building decisions and applying their effect to the engine's state."""

from __future__ import annotations

from typing import Optional

from trainwarden.engine import progress
from trainwarden.engine.limits import first_limit_reached
from trainwarden.engine.state import (DROPPED_MESSAGES_RULE, InstanceState, InstanceStatus, JobState, JobStatus,
                                      SpotPhase)
from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason, action_id

MAX_MESSAGE = 4000


def guarded(state: JobState, intent: DecisionKind, reason: Reason, rule: str,
            inst: Optional[InstanceState], now: float, source: Optional[ErrorSource],
            signature: str = "") -> tuple[DecisionKind, Reason, str]:
    """The intent after the limits: a restart that a limit forbids fails the job."""
    if intent in (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE):
        limit = first_limit_reached(state, intent, inst, signature, now, source)
        if limit is not None:
            return DecisionKind.FAIL_JOB, limit.reason, limit.name
    return intent, reason, rule


def make_decision(state: JobState, kind: DecisionKind, reason: Reason, rule: str, now: float, *,
                  fault_key: tuple, source: Optional[ErrorSource] = None,
                  inst: Optional[InstanceState] = None, error_code: int = 0, message: str = "",
                  signature: str = "", category: str = "", classifier: str = "",
                  detected_at: Optional[float] = None, node: str = "", verdict: str = "",
                  consequences: tuple[str, ...] = (), evidence: str = "") -> Decision:
    starts: tuple = ()
    if kind is DecisionKind.RESTART_JOB:
        starts = tuple((i.name, i.start + 1) for i in state.instances.values())
    elif kind in (DecisionKind.START_JOB, DecisionKind.RESUME_JOB):
        starts = tuple((i.name, i.start) for i in state.instances.values())
    return Decision(
        kind=kind,
        reason=reason,
        rule=rule,
        job_id=state.job_id,
        time=now,
        round=state.round,
        action_id=action_id(state.job_id, kind.value, *fault_key),
        error_source=source,
        instance=inst.name if inst else "",
        node=node or (inst.node if inst else ""),
        error_code=error_code,
        error_message=message[:MAX_MESSAGE],
        error_signature=signature,
        category=category,
        classifier=classifier,
        detected_at=now if detected_at is None else detected_at,
        next_start=inst.start + 1 if inst is not None and kind is DecisionKind.RESTART_INSTANCE else 0,
        starts=starts,
        verdict=verdict,
        consequences=consequences,
        evidence=evidence,
    )


def apply(state: JobState, decision: Decision) -> None:
    """Move the state to where the decision leads, before the actuator acts:
    events of the incarnations it ends are stale from now on."""
    kind = decision.kind
    if decision.rule == DROPPED_MESSAGES_RULE:
        state.messages_dropped = 0  # told (engine/messages.py)
    if kind in (DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB, DecisionKind.COMPLETE_JOB, DecisionKind.REQUEUE):
        # Failures still waiting for attribution belong to the round that ends.
        state.pending_failures = None
    if kind in (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE):
        inst = state.instances.get(decision.instance) if decision.instance else None
        progress.note_restart(state, kind, decision.error_source, inst, decision.time)
    if kind is DecisionKind.RESTART_JOB:
        state.round += 1
        if decision.reason is not Reason.PREEMPTED:  # the scheduler's doing, not the job's: no limit counts it
            state.job_restarts += 1
        state.first_success_exit = None
        for inst in state.instances.values():
            _reset_incarnation(inst)
    elif kind is DecisionKind.RESTART_INSTANCE:
        inst = state.instances[decision.instance]
        inst.restarts += 1
        _reset_incarnation(inst)
    elif kind is DecisionKind.FAIL_JOB:
        state.status = JobStatus.FAILED
        state.final_reason = decision.reason.value
    elif kind is DecisionKind.COMPLETE_JOB:
        state.status = JobStatus.SUCCEEDED
        state.final_reason = decision.reason.value
    elif kind is DecisionKind.REQUEUE:
        # Like a restart for staleness (a new round), but not a restart: no
        # limit counts it, and nothing starts until the market allows.
        state.round += 1
        state.first_success_exit = None
        for inst in state.instances.values():
            _reset_incarnation(inst)
    if state.spot is not None:
        _apply_spot(state, kind)


def _apply_spot(state: JobState, kind: DecisionKind) -> None:
    spot = state.spot
    if kind is DecisionKind.START_JOB:
        spot.phase, spot.started = SpotPhase.RUNNING, True
    elif kind is DecisionKind.RESUME_JOB:
        spot.phase = SpotPhase.RUNNING
        spot.resumes += 1
    elif kind is DecisionKind.REQUEUE:
        spot.phase = SpotPhase.QUEUED
        spot.preemptions += 1
    elif kind is DecisionKind.QUEUE_JOB:
        spot.phase = SpotPhase.QUEUED
    elif kind in (DecisionKind.COMPLETE_JOB, DecisionKind.FAIL_JOB):
        spot.phase = SpotPhase.DONE


def _reset_incarnation(inst: InstanceState) -> None:
    inst.start += 1
    inst.status = InstanceStatus.PENDING
    # Interval overrides belong to the running code; a new incarnation starts
    # with the job's configured interval.
    inst.hang_interval = None
    inst.spoke = False
    inst.tail.clear()
