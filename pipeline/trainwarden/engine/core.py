"""The decision core: ``step(state, event, now) -> (state, decisions)``.

No clock, no I/O, no sleeping: time arrives as ``now``. The same function
serves the embedded run, the Kafka processor, rule unit tests and simulation.

``now`` is the deciding process's clock when it learned of the event, and
everything a timer later compares with ``now`` (when an instance started,
last printed, was last reported on) is dated by it, never by the event's
``time``: that is another process's clock (an agent's, ``submit``'s), and
comparing the two would turn their skew into silence or liveness. An event's
``time`` is kept for what is recorded (``detected_at``, the failure's time).
"""

from __future__ import annotations

from typing import Optional

import msgspec

from trainwarden.diagnose.advice import WATCHDOG_MARK, advised_interval, watchdog_timeout
from trainwarden.engine import failures, messages, preemption, progress, spot, timers
from trainwarden.engine.decide import apply, guarded, make_decision
from trainwarden.engine.state import InstanceStatus, JobState, JobStatus, new_job_state
from trainwarden.events import (
    Decision,
    DecisionKind,
    Diagnosis,
    ErrorSource,
    Event,
    InstanceActivity,
    InstanceExited,
    InstanceStarted,
    JobSubmitted,
    LogLine,
    MarketUpdate,
    NodeLost,
    Preempted,
    Reason,
    SdkMessage,
    SdkOp,
    Tick,
)
from trainwarden.limits import MAX_INSTANCES, MAX_ROLES
from trainwarden.rules.model import RulePack
from trainwarden.sdk.protocol import MAX_STEP
from trainwarden.settings import JobSettings, SettingsError, parse_args_string

MAX_KEYWORDS = 1000
_ENDINGS = (DecisionKind.FAIL_JOB, DecisionKind.COMPLETE_JOB)
C4D_LEVELS = ("Info", "Warning", "Error")
_NO_DECISIONS: list = []  # shared and never mutated: the common answer to a log line


def start_job(event: JobSubmitted, pack: RulePack, now: float,
              settings: Optional[JobSettings] = None) -> tuple[JobState, list[Decision]]:
    """The state of a newly submitted job; an invalid arguments string, or
    more instances than a job may have, fails it at once (and cheaply: no
    state is made for the instances of a job refused for their number).
    ``settings``: the event's arguments string as parsed where the job was
    defined (``run``); without them the string is parsed here (the
    processor's parse, the one a job submitted to the cluster gets)."""
    instances = event.instances
    problem = "" if instances else "the job has no instances"
    if settings is None:
        try:
            settings = parse_args_string(event.args)
        except SettingsError as exc:
            # Only the state of a job failed at once: it never runs on them.
            settings, problem = JobSettings(), str(exc)
    if len(instances) > MAX_INSTANCES:
        problem, instances = f"the job has {len(instances):,} instances; a job may have at most {MAX_INSTANCES}", ()
    elif event.spec is not None and len(event.spec.roles) > MAX_ROLES:
        problem, instances = f"the job has {len(event.spec.roles):,} roles; a job may have at most {MAX_ROLES}", ()
    state = new_job_state(event.job_id, event.framework, settings, pack, instances)
    state.activity_reports = event.activity_reports
    if event.spot and not problem:
        state.spot = spot.new_spot_state(state, event, now)
    if problem:
        decision = make_decision(state, DecisionKind.FAIL_JOB, Reason.INVALID_JOB, "job_arguments", now,
                                 fault_key=("invalid",), message=problem)
    elif state.spot is not None:
        # Instances come from the market: the job waits until its bids are met.
        return state, spot.settle(state, [spot.queue_decision(state, now, event.time)], now)
    else:
        decision = msgspec.structs.replace(
            make_decision(state, DecisionKind.START_JOB, Reason.JOB_SUBMITTED, "job_submitted", now,
                          fault_key=("start",), detected_at=event.time),
            spec=event.spec, instances=event.instances, args=event.args)
    apply(state, decision)
    return state, [decision]


def step(state: JobState, event: Event, now: float) -> tuple[JobState, list[Decision]]:
    if state.finished:
        state.stale_events += 1
        return state, []
    handler = _HANDLERS.get(type(event))
    decisions = handler(state, event, now) if handler else []
    if state.messages_dropped and any(d.kind in _ENDINGS for d in decisions):
        decisions = messages.tell_dropped(state, now, ending=True) + decisions  # told before the job ends
    if state.spot is not None and decisions:
        return state, spot.settle(state, decisions, now)
    for decision in decisions:
        apply(state, decision)
    return state, decisions


def _on_started(state: JobState, event: InstanceStarted, now: float) -> list[Decision]:
    inst = state.current(event.instance, event.round, event.start)
    if inst is None or inst.status is not InstanceStatus.PENDING:
        return []
    inst.status = InstanceStatus.RUNNING
    inst.started_at = inst.last_output = inst.reported_at = now
    inst.reported_output = None
    inst.node = event.node
    inst.pid = event.pid
    return []


def _on_log(state: JobState, event: LogLine, now: float) -> list[Decision]:
    inst = state.current(event.instance, event.round, event.start)
    if inst is None:
        return []
    if now > inst.last_output and not _reported_already(inst, event):
        inst.last_output = now
    inst.spoke = True
    text = event.text
    inst.tail.append(text)
    if WATCHDOG_MARK not in text:  # inline: this runs for every line of every instance
        return _NO_DECISIONS
    timeout = watchdog_timeout(text)
    return _NO_DECISIONS if timeout is None else _advise(state, inst, timeout, event, now)


def _reported_already(inst, event: LogLine) -> bool:
    """Whether the agent's latest report on the incarnation already counted
    this line (both times on that agent's clock): a line read again after a
    takeover is old output, and dating it by its arrival would restart a
    silence the report proved."""
    return event.said is not None and inst.reported_output is not None and event.said <= inst.reported_output


def _advise(state: JobState, inst, timeout: float, event: LogLine, now: float) -> list[Decision]:
    """A collective timeout at or under the hang interval in force means the
    job dies before a hang is detected (and its stacks taken): say so, once."""
    settings = state.settings
    interval = settings.job_hang_interval if inst.hang_interval is None else inst.hang_interval
    if timeout in state.advised_timeouts or interval < 0 or interval < timeout:
        return []
    state.advised_timeouts.add(timeout)
    advised = advised_interval(timeout)
    message = (f"the collective timeout is {timeout:g} s but the hang interval is {interval} s: a hang ends in "
               f"the watchdog's kill before it is detected; set --job-hang-interval={advised}")
    return [make_decision(state, DecisionKind.NOTIFY, Reason.ADVICE_HANG_INTERVAL, "advice_hang_interval", now,
                          fault_key=("advice", timeout), inst=inst, message=message,
                          category="advice", detected_at=event.time)]


def _on_exit(state: JobState, event: InstanceExited, now: float) -> list[Decision]:
    inst = state.current(event.instance, event.round, event.start)
    if inst is None or inst.status is not InstanceStatus.RUNNING:
        return []
    if event.exit_code == 0:
        return failures.on_success(state, inst, event, now)
    return failures.on_failure(state, inst, event, now)


def _on_sdk(state: JobState, event: SdkMessage, now: float) -> list[Decision]:
    op = event.op
    if op is SdkOp.SET_RETRYABLE_ERRORS:
        # Keywords belong to the job: kept across restarts, whichever incarnation sent them.
        for keyword in event.keywords:
            if keyword and keyword not in state.custom_keywords and len(state.custom_keywords) < MAX_KEYWORDS:
                state.custom_keywords.append(keyword)
        return []
    if op is SdkOp.CUSTOM_MESSAGE:
        return messages.on_custom_message(state, event, now)
    if op is SdkOp.REPORT_PROGRESS:
        inst = state.current(event.instance, event.round, event.start)
        # From the bus: a step out of the SDK's range is not the SDK's.
        if inst is not None and event.step is not None and 0 <= event.step <= MAX_STEP:
            inst.spoke = True
            progress.note_progress(state, inst, event.step)
        return []
    if op is SdkOp.SET_HANG_INTERVAL:
        inst = state.current(event.instance, event.round, event.start)
        if inst is not None:
            inst.hang_interval = event.interval
            inst.spoke = True
            # A new interval restarts the silence clock: leaving a long silent
            # hang_detect(-1) scope is not an instant hang.
            inst.last_output = max(inst.last_output, now)
    return []


def _on_tick(state: JobState, event: Tick, now: float) -> list[Decision]:
    told = messages.tell_dropped(state, now)
    if state.pending_failures is not None:
        decisions = failures.settle_pending(state, now)
        if decisions:
            return told + decisions
    return told + timers.check_timers(state, now)


def _on_activity(state: JobState, event: InstanceActivity, now: float) -> list[Decision]:
    # The agent says how long each instance has been silent, on its own clock;
    # the last output is dated by ours: now minus that silence (the report's
    # time in transit counts as output, so silence is never overstated).
    for report in event.instances:
        inst = state.current(report.instance, report.round, report.start)
        if inst is None:
            continue
        heard = now - report.silence(event.time)
        if heard > inst.last_output:
            inst.last_output = heard
        # A report without ``spoke`` (an older agent) says nothing of it: the
        # start-up allowance stays, which can delay a hang, never fake one.
        inst.spoke = inst.spoke or bool(report.spoke)
        inst.reported_at = max(inst.reported_at, now)
        inst.reported_output = report.last_output
    return []


def _on_node_lost(state: JobState, event: NodeLost, now: float) -> list[Decision]:
    if spot.queued(state):
        return []  # a job in the bidding queue holds no node
    decisions = []
    for name in event.instances:
        inst = state.instances.get(name)
        if inst is None or inst.status not in (InstanceStatus.RUNNING, InstanceStatus.PENDING):
            continue
        # A pending instance was placed there but never reported a start: the
        # engine does not know its node, the actuator that placed it does.
        if inst.status is InstanceStatus.RUNNING and inst.node != event.node:
            continue
        decision = failures.on_node_lost(state, inst, event.node, now, event.time)
        decisions.append(decision)
        if decision.kind is not DecisionKind.RESTART_INSTANCE:
            break  # a job restart or failure covers every other instance
    return decisions


def _on_diagnosis(state: JobState, event: Diagnosis, now: float) -> list[Decision]:
    if spot.queued(state):
        return []
    settings = state.settings
    if event.level in C4D_LEVELS and C4D_LEVELS.index(event.level) < C4D_LEVELS.index(settings.c4d_log_level.value):
        return []  # below --c4d-log-level: not shown, not acted on
    for rule in state.pack.diagnoses:
        if rule.source != event.source or (rule.levels and event.level not in rule.levels):
            continue
        if rule.kinds and event.kind not in rule.kinds:
            continue
        if not all(settings.flag_value(flag) for flag in rule.enabled_by):
            continue
        message = f"C4D {event.level} {event.kind} on node {event.node}" + (
            f" (rank {event.rank})" if event.rank >= 0 else "") + (f": {event.detail}" if event.detail else "")
        key = (event.source, state.round, event.node, event.kind, event.level)
        decisions = []
        if rule.isolate_node:
            decisions.append(make_decision(state, DecisionKind.ISOLATE_NODE, rule.reason, rule.name, now,
                                           fault_key=key, source=ErrorSource.C4D, message=message,
                                           signature=f"c4d:{event.kind}", category=event.kind,
                                           detected_at=event.time, node=event.node))
        if rule.action is DecisionKind.RESTART_JOB:
            kind, reason, name = guarded(state, DecisionKind.RESTART_JOB, rule.reason, rule.name, None, now,
                                         ErrorSource.C4D)
            decisions.append(make_decision(state, kind, reason, name, now, fault_key=key, source=ErrorSource.C4D,
                                           message=message, signature=f"c4d:{event.kind}",
                                           category=event.kind, detected_at=event.time, node=event.node))
        elif rule.action is DecisionKind.NOTIFY:
            decisions.append(make_decision(state, DecisionKind.NOTIFY, rule.reason, rule.name, now,
                                           fault_key=key, source=ErrorSource.C4D, message=message,
                                           category=event.kind, detected_at=event.time, node=event.node))
        return decisions
    return []


_HANDLERS = {
    InstanceStarted: _on_started,
    LogLine: _on_log,
    InstanceExited: _on_exit,
    SdkMessage: _on_sdk,
    Tick: _on_tick,
    InstanceActivity: _on_activity,
    NodeLost: _on_node_lost,
    Diagnosis: _on_diagnosis,
    MarketUpdate: spot.on_market,
    Preempted: preemption.on_preempted,
}


def fail_for_engine_error(state: JobState, error: str, now: float) -> tuple[JobState, Decision]:
    """The state can no longer be trusted after ``step`` raised: fail the
    job, saying why, rather than leave it unsupervised."""
    decision = make_decision(state, DecisionKind.FAIL_JOB, Reason.ENGINE_ERROR, "engine_error", now,
                             fault_key=("engine_error",), message=f"engine error: {error}")
    apply(state, decision)
    return state, decision


def replay_decision(state: JobState, decision: Decision) -> JobState:
    """Re-apply a decision taken earlier and recorded (a processor's replay of
    timer decisions): the state moves on as when it was first taken."""
    if not state.finished:
        apply(state, decision)
    return state


def rebase_times(state: JobState, now: float) -> JobState:
    """Move the timers of a state rebuilt by a replay onto the clock of ``now``.

    A replay steps each event at its own ``time`` so that the decisions events
    caused are derived again as they were first; that leaves the timers on the
    clocks of the processes that sent the events. Each instance's times move by
    the shift that brings its agent's last report on it to ``now``, which keeps
    the silence (and run time) that agent measured on its own clock and counts
    the time since that report as output; timers with no such anchor (an exit
    hang's, a failure window's) start again at ``now``. A takeover may so delay
    a timer's decision, by about one report interval (a timer without an anchor:
    by its own interval), and can never bring one forward."""
    for inst in state.instances.values():
        if inst.status is InstanceStatus.PENDING:
            continue  # not started yet: its times are the next InstanceStarted's
        shift = now - inst.reported_at
        inst.last_output = min(now, inst.last_output + shift)
        inst.started_at = min(now, inst.started_at + shift)
        inst.reported_at = now
    if state.first_success_exit is not None:
        state.first_success_exit = now
    pending = state.pending_failures
    if pending is not None:
        pending.deadline = now + max(0.0, pending.deadline - pending.opened_at)
        pending.opened_at = now
    return state


def outcome(state: JobState) -> Optional[JobStatus]:
    return state.status if state.finished else None
