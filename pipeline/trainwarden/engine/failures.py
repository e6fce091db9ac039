"""An instance exited: success bookkeeping, or judging a failure.

A failure is classified (catalogue), answered (first matching response) and
guarded (limits). Same-error counts and the failed-instance set are updated
before the limits are checked, so counters include the fault being judged.
"""

from __future__ import annotations

from trainwarden.classify import Verdict, classify
from trainwarden.engine.decide import guarded, make_decision
from trainwarden.engine.state import NON_FINISHING_ROLES, InstanceState, InstanceStatus, JobState
from trainwarden.events import Decision, DecisionKind, ErrorSource, InstanceExited, Reason
from trainwarden.rules.model import Response
from trainwarden.settings import ExecutionMode, FaultTolerantPolicy


def on_success(state: JobState, inst: InstanceState, event: InstanceExited, now: float) -> list[Decision]:
    inst.status = InstanceStatus.SUCCEEDED
    if state.first_success_exit is None:
        state.first_success_exit = event.time
    finishing = [i for i in state.instances.values() if i.role not in NON_FINISHING_ROLES]
    if not finishing:
        finishing = list(state.instances.values())
    if all(i.status is InstanceStatus.SUCCEEDED for i in finishing):
        return [make_decision(state, DecisionKind.COMPLETE_JOB, Reason.ALL_INSTANCES_SUCCEEDED,
                              "job_complete", now, fault_key=("complete",), detected_at=event.time)]
    return []


def first_response(state: JobState, inst: InstanceState, verdict: Verdict) -> Response | None:
    settings = state.settings
    policy = settings.fault_tolerant_policy.value
    mode = settings.job_execution_mode.value
    for response in state.pack.responses:
        when = response.when
        if when.policies and policy not in when.policies:
            continue
        if when.modes and mode not in when.modes:
            continue
        if when.roles and inst.role not in when.roles:
            continue
        if when.retryable is not None and when.retryable != verdict.retryable:
            continue
        return response
    return None


def on_failure(state: JobState, inst: InstanceState, event: InstanceExited, now: float) -> list[Decision]:
    settings = state.settings
    keywords = state.custom_keywords if (
        settings.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG) else ()
    # An exit that brings its own tail (from a node agent) is judged on it
    # alone: log lines travel separately and may not all have arrived.
    tail = list(event.tail) if event.tail is not None else list(inst.tail)
    verdict = classify(state.pack, event.exit_code, tail, keywords)
    message = verdict.message or f"exited with code {event.exit_code}"
    return [respond(state, inst, verdict, now, source=ErrorSource.INSTANCE_EXIT, error_code=event.exit_code,
                    message=message, detected_at=event.time)]


def on_node_lost(state: JobState, inst: InstanceState, node: str, now: float, detected_at: float) -> Decision:
    """An instance whose node stopped answering: a retryable failure of it."""
    verdict = Verdict(retryable=True, category="node_lost", rule="node_lost", matched_line="",
                      signature=f"node_lost:{node}", message="")
    return respond(state, inst, verdict, now, source=ErrorSource.NODE_LOST, error_code=0,
                   message=f"node {node} was lost (no heartbeat); its instance {inst.name} is gone",
                   detected_at=detected_at)


def respond(state: JobState, inst: InstanceState, verdict: Verdict, now: float, *, source: ErrorSource,
            error_code: int, message: str, detected_at: float) -> Decision:
    """The decision for a failed instance: the first matching response, then the limits."""
    inst.status = InstanceStatus.FAILED
    inst.ever_failed = True
    signature = f"{error_code}:{verdict.signature}"
    inst.error_counts[signature] = inst.error_counts.get(signature, 0) + 1
    response = first_response(state, inst, verdict)
    if response is None:
        intent, reason, rule = DecisionKind.FAIL_JOB, Reason.INSTANCE_FAILED, "no_matching_response"
    else:
        intent, reason, rule = response.action, response.reason, response.name
    if intent is DecisionKind.RESTART_INSTANCE and state.settings.job_execution_mode is ExecutionMode.SYNC:
        # Coupled instances cannot recover one by one.
        intent = DecisionKind.RESTART_JOB
    if source is ErrorSource.NODE_LOST and reason in (Reason.RETRYABLE_FAILURE, Reason.INSTANCE_FAILED):
        reason = Reason.NODE_LOST
    kind, reason, rule = guarded(state, intent, reason, rule, inst, signature)
    return make_decision(
        state, kind, reason, rule, now,
        fault_key=(source.value, state.round, inst.name, inst.start),
        source=source, inst=inst, error_code=error_code,
        message=message, signature=signature, category=verdict.category,
        classifier=verdict.rule, detected_at=detected_at,
    )
