"""An instance exited: success bookkeeping, or judging a failure.

A failure is classified (catalogue), attributed (in a Sync job, the root
cause among the instances that failed together), answered (first matching
response) and guarded (limits). Same-error counts and the failed-instance
set are updated before the limits are checked, so counters include the
fault being judged.
"""

from __future__ import annotations

import signal

from trainwarden.attribution import Failure, Judgement, judge
from trainwarden.classify import Verdict
from trainwarden.engine import operational
from trainwarden.engine.decide import guarded, make_decision
from trainwarden.engine.state import NON_FINISHING_ROLES, InstanceState, InstanceStatus, JobState, PendingFailures
from trainwarden.events import Decision, DecisionKind, ErrorSource, InstanceExited, Reason
from trainwarden.evidence.signals import canonical_exit_code, signal_of_exit
from trainwarden.rules.model import Response, Retryability
from trainwarden.settings import ExecutionMode, FaultTolerantPolicy

MAX_CONSEQUENCES = 64
# The category of deaths by a signal from outside the job (catalogue: killed_by_platform and kin).
PLATFORM_SIGNAL = "platform_signal"


def on_success(state: JobState, inst: InstanceState, event: InstanceExited, now: float) -> list[Decision]:
    inst.status = InstanceStatus.SUCCEEDED
    if state.first_success_exit is None:
        state.first_success_exit = now  # the exit hang's timer: on the deciding clock, not the agent's
    finishing = [i for i in state.instances.values() if i.role not in NON_FINISHING_ROLES]
    if not finishing:
        finishing = list(state.instances.values())
    if all(i.status is InstanceStatus.SUCCEEDED for i in finishing):
        return [make_decision(state, DecisionKind.COMPLETE_JOB, Reason.ALL_INSTANCES_SUCCEEDED,
                              "job_complete", now, fault_key=("complete",), detected_at=event.time)]
    return settle_pending(state, now) if state.pending_failures is not None else []


def first_response(state: JobState, inst: InstanceState, retryable: bool) -> Response | None:
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
        if when.retryable is not None and when.retryable != retryable:
            continue
        return response
    return None


def _keywords(state: JobState) -> tuple[str, ...]:
    policy = state.settings.fault_tolerant_policy
    return tuple(state.custom_keywords) if policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG else ()


def _attributes(state: JobState) -> bool:
    """Whether failures wait for the others before judging: coupled (Sync)
    instances judged by their errors, with a window to wait in."""
    settings = state.settings
    return (settings.job_execution_mode is ExecutionMode.SYNC
            and settings.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
            and state.pack.attribution_window_s > 0 and len(state.instances) > 1)


def _sync(state: JobState) -> bool:
    return state.settings.job_execution_mode is ExecutionMode.SYNC


def _awaits_notice(state: JobState, judgement: Judgement) -> bool:
    """Whether this failure may be a scheduler preempting the job, whose
    notice (a Preempted event) may still come: a death by an outside
    SIGTERM, with nothing of its own to say."""
    root = judgement.root
    return (state.pack.platform_notice_window_s > 0 and signal_of_exit(root.exit_code) == signal.SIGTERM
            and root.verdict.category == PLATFORM_SIGNAL)


def on_failure(state: JobState, inst: InstanceState, event: InstanceExited, now: float) -> list[Decision]:
    # An exit that brings its own tail (from a node agent) is judged on it
    # alone: log lines travel separately and may not all have arrived.
    tail = tuple(event.tail) if event.tail is not None else tuple(inst.tail)
    failure = Failure(inst.name, event.exit_code, tail, event.time)
    # A Sync job's failures are judged together while any wait (settle_pending);
    # otherwise a failure waits only if it may be a preemption, and alone.
    if not (_attributes(state) or (_sync(state) and state.pending_failures is not None)):
        judgement = judge(state.pack, [failure], _keywords(state))
        if not _awaits_notice(state, judgement):
            return respond_judgement(state, judgement, now)
    inst.status = InstanceStatus.FAILED
    pending = state.pending_failures
    if pending is None:
        window = state.pack.attribution_window_s if _attributes(state) else state.pack.platform_notice_window_s
        pending = state.pending_failures = PendingFailures(opened_at=now, deadline=now + window, failures=[])
    pending.failures.append(failure)
    return settle_pending(state, now)


def settle_pending(state: JobState, now: float) -> list[Decision]:
    """Judge the failures waiting for attribution once a root cause is
    evident (a failure that is not aftermath and whose verdict is known),
    every instance has exited, or the window is over. Only aftermath and
    unknown failures wait: an own error, or a bare SIGKILL, decides at once.
    A death by an outside SIGTERM waits out the platform notice window,
    even when every instance is in: the scheduler's Preempted may follow.
    An Async job's deaths held for that notice are judged one by one."""
    pending = state.pending_failures
    if pending is None:
        return []
    notice_until = pending.opened_at + state.pack.platform_notice_window_s
    if not _sync(state):
        if now < notice_until:
            return []
        state.pending_failures = None
        decisions = []
        for failure in pending.failures:
            decided = respond_judgement(state, judge(state.pack, [failure], _keywords(state)), now)
            decisions.extend(decided)
            if decided[-1].kind is not DecisionKind.RESTART_INSTANCE:
                break  # a job restart or failure covers every other instance
        return decisions
    judgement = judge(state.pack, pending.failures, _keywords(state))
    if _awaits_notice(state, judgement) and now < notice_until:
        pending.deadline = max(pending.deadline, notice_until)  # the timers wake the engine then
        return []
    running = any(i.status in (InstanceStatus.RUNNING, InstanceStatus.PENDING) for i in state.instances.values())
    decided = not judgement.root.consequence and judgement.verdict.verdict is not Retryability.UNKNOWN
    if not (decided or not running or now >= pending.deadline):
        return []
    state.pending_failures = None
    return respond_judgement(state, judgement, now)


def respond_judgement(state: JobState, judgement: Judgement, now: float) -> list[Decision]:
    root = judgement.root
    inst = state.instances[root.instance]
    failure_time = min((j.time for j in (root, *judgement.consequences)), default=root.time)
    verdict = root.verdict
    message = verdict.message or f"exited with code {root.exit_code}"
    if root.rank is not None:
        message = f"rank {root.rank}: {message}"
    consequences = tuple(f"{j.label}: {j.verdict.category}" for j in judgement.consequences[:MAX_CONSEQUENCES])
    return respond(state, inst, verdict, now, source=ErrorSource.INSTANCE_EXIT, error_code=root.exit_code,
                   message=message, detected_at=failure_time, consequences=consequences, lines=root.lines)


def on_node_lost(state: JobState, inst: InstanceState, node: str, now: float, detected_at: float) -> Decision:
    """An instance whose node stopped answering: a retryable failure of it."""
    verdict = Verdict(verdict=Retryability.RETRYABLE, category="node_lost", rule="node_lost", matched_line="",
                      signature=f"node_lost:{node}", message="", kind="own")
    [decision] = respond(state, inst, verdict, now, source=ErrorSource.NODE_LOST, error_code=0,
                   message=f"node {node} was lost (no heartbeat); its instance {inst.name} is gone",
                   detected_at=detected_at)
    return decision


def respond(state: JobState, inst: InstanceState, verdict: Verdict, now: float, *, source: ErrorSource,
            error_code: int, message: str, detected_at: float,
            consequences: tuple[str, ...] = (), lines: tuple[str, ...] = ()) -> list[Decision]:
    """The decisions for a failed instance: the first matching response,
    weighed with what the job did (engine/operational.py), then the limits;
    the node's isolation first when the failure is the node's."""
    inst.status = InstanceStatus.FAILED
    inst.ever_failed = True
    signature = f"{canonical_exit_code(error_code)}:{verdict.signature}"
    inst.error_counts[signature] = inst.error_counts.get(signature, 0) + 1
    retryable, unknown_repeated = _effective_retryable(state, inst, verdict, signature)
    response = first_response(state, inst, retryable)
    if response is None:
        intent, reason, rule = DecisionKind.FAIL_JOB, Reason.INSTANCE_FAILED, "no_matching_response"
    else:
        intent, reason, rule = response.action, response.reason, response.name
    if unknown_repeated and intent is DecisionKind.FAIL_JOB and reason is Reason.NON_RETRYABLE_FAILURE:
        reason, rule = Reason.UNKNOWN_FAILURE_REPEATED, "unknown_policy"
    if intent is DecisionKind.RESTART_INSTANCE and state.settings.job_execution_mode is ExecutionMode.SYNC:
        # Coupled instances cannot recover one by one.
        intent = DecisionKind.RESTART_JOB
    if source is ErrorSource.NODE_LOST and reason in (Reason.RETRYABLE_FAILURE, Reason.INSTANCE_FAILED):
        reason = Reason.NODE_LOST
    weighed = operational.weigh(state, inst, verdict, signature, intent, reason, rule, source, now, lines)
    kind, reason, rule = guarded(state, weighed.intent, weighed.reason, weighed.rule, inst, now, source, signature)
    fault_key = (source.value, state.round, inst.name, inst.start)
    details = dict(source=source, inst=inst, error_code=error_code, message=message, signature=signature,
                   category=verdict.category, classifier=verdict.rule, detected_at=detected_at,
                   verdict=verdict.verdict.value, consequences=consequences, evidence=weighed.evidence)
    decision = make_decision(state, kind, reason, rule, now, fault_key=fault_key, **details)
    if not weighed.isolate_node or kind is DecisionKind.FAIL_JOB:
        return [decision]
    isolation = make_decision(state, DecisionKind.ISOLATE_NODE, Reason.NODE_FAULT, weighed.rule, now,
                              fault_key=("node_fault", *fault_key), **details)
    return [isolation, decision]


def _effective_retryable(state: JobState, inst: InstanceState, verdict: Verdict,
                         signature: str) -> tuple[bool, bool]:
    """(retryable as far as the responses are concerned, whether an unknown
    error has come back past the unknown policy's restarts)."""
    if verdict.verdict is not Retryability.UNKNOWN:
        return verdict.retryable, False
    allowed = inst.error_counts.get(signature, 0) <= state.pack.unknown_restarts
    return allowed, not allowed

