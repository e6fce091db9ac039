"""An instance exited: success bookkeeping, or judging a failure.

A failure is classified (catalogue), answered (first matching response) and
guarded (limits). Same-error counts and the failed-instance set are updated
before the limits are checked, so counters include the fault being judged.
"""

from __future__ import annotations

from pipeline.classify import Verdict, classify
from pipeline.engine.decide import guarded, make_decision
from pipeline.engine.state import NON_FINISHING_ROLES, InstanceState, InstanceStatus, JobState
from pipeline.events import Decision, DecisionKind, ErrorSource, InstanceExited, Reason
from pipeline.rules.model import Response
from pipeline.settings import ExecutionMode, FaultTolerantPolicy


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
    inst.status = InstanceStatus.FAILED
    inst.ever_failed = True
    settings = state.settings
    keywords = state.custom_keywords if (
        settings.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG) else ()
    verdict = classify(state.pack, event.exit_code, list(inst.tail), keywords)
    signature = f"{event.exit_code}:{verdict.signature}"
    inst.error_counts[signature] = inst.error_counts.get(signature, 0) + 1

    response = first_response(state, inst, verdict)
    if response is None:
        intent, reason, rule = DecisionKind.FAIL_JOB, Reason.INSTANCE_FAILED, "no_matching_response"
    else:
        intent, reason, rule = response.action, response.reason, response.name
    if intent is DecisionKind.RESTART_INSTANCE and settings.job_execution_mode is ExecutionMode.SYNC:
        # Coupled instances cannot recover one by one.
        intent = DecisionKind.RESTART_JOB
    kind, reason, rule = guarded(state, intent, reason, rule, inst, signature)
    message = verdict.message or f"exited with code {event.exit_code}"
    return [make_decision(
        state, kind, reason, rule, now,
        fault_key=("exit", state.round, inst.name, inst.start),
        source=ErrorSource.INSTANCE_EXIT, inst=inst, error_code=event.exit_code,
        message=message, signature=signature, category=verdict.category,
        classifier=verdict.rule, detected_at=event.time,
    )]
