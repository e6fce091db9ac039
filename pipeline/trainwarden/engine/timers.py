"""Detectors driven by the passage of time: hang (silence) and exit hang.

Both are evaluated on every event with the ``now`` the caller passes in, so
a tick every second bounds detection latency to one second. Every time they
compare with ``now`` was taken on the same clock (engine/core.py): silence is
when output became known to the deciding process, never an agent's clock
held against the processor's, so a skew between hosts neither hides a hang
nor makes one.
"""

from __future__ import annotations

from typing import Optional

from trainwarden.engine.decide import guarded, make_decision
from trainwarden.engine.state import InstanceStatus, JobState
from trainwarden.events import Decision
from trainwarden.rules.model import Detector, DetectorKind

# A node agent reports every second; with no report for this long (reports
# arrived, on the deciding clock) its instances' silence is unknown rather than proven.
REPORT_STALE_S = 3.0


def interval_in_force(inst, detector: Detector, job_interval: int) -> int:
    """The silence an instance may keep: its interval (the job's or the
    SDK's), and before its first line at least the start-up allowance."""
    interval = job_interval if inst.hang_interval is None else inst.hang_interval
    if interval >= 0 and not inst.spoke and detector.startup_allowance_s > interval:
        return detector.startup_allowance_s
    return interval


def _active(state: JobState, detector: Detector) -> bool:
    settings = state.settings
    if detector.enabled_by and not settings.flag_value(detector.enabled_by):
        return False
    return not detector.modes or settings.job_execution_mode.value in detector.modes


def silence_deadline(state: JobState, detector: Detector) -> Optional[float]:
    """When the job becomes hung if nobody prints again; None if it cannot."""
    if not _active(state, detector):
        return None
    job_interval = state.settings.flag_value(detector.interval_flag)
    deadline = None
    for inst in state.instances.values():
        if inst.status is InstanceStatus.PENDING:
            return None  # a (re)start is under way
        if inst.status is not InstanceStatus.RUNNING:
            continue
        interval = interval_in_force(inst, detector, job_interval)
        if interval < 0:
            return None  # this instance's detection is off: it keeps the job from counting as hung
        candidate = inst.last_output + interval
        if deadline is None or candidate > deadline:
            deadline = candidate
    return deadline


def _is_silent(state: JobState, detector: Detector, now: float) -> bool:
    # Equivalent to silence_deadline() <= now, but stops at the first instance
    # that spoke recently, which in a healthy job is the first one looked at.
    if not _active(state, detector):
        return False
    job_interval = state.settings.flag_value(detector.interval_flag)
    any_running = False
    for inst in state.instances.values():
        status = inst.status
        if status is InstanceStatus.PENDING:
            return False
        if status is not InstanceStatus.RUNNING:
            continue
        interval = interval_in_force(inst, detector, job_interval)
        if interval < 0 or now - inst.last_output < interval:
            return False
        if state.activity_reports and now - inst.reported_at > REPORT_STALE_S:
            state.silence_checks_skipped += 1
            return False
        any_running = True
    return any_running


def check_silence(state: JobState, detector: Detector, now: float) -> list[Decision]:
    if not _is_silent(state, detector, now):
        return []
    running = [i for i in state.instances.values() if i.status is InstanceStatus.RUNNING]
    longest = max(now - i.last_output for i in running)
    shortest = min(now - i.last_output for i in running)
    message = (f"no output from any of the {len(running)} running instances for at least "
               f"{shortest:.0f} s (longest silence {longest:.0f} s)")
    mute = [i.name for i in running if not i.spoke]
    if mute:
        message += (f"; {len(mute)} never printed a line within the start-up allowance "
                    f"({detector.startup_allowance_s} s): {', '.join(mute[:5])}" + (" ..." if len(mute) > 5 else ""))
    kind, reason, rule = guarded(state, detector.action, detector.reason, detector.name, None, now,
                                 detector.error_source)
    return [make_decision(state, kind, reason, rule, now, fault_key=(detector.name, state.round),
                          source=detector.error_source, message=message, signature=detector.name,
                          category="hang", classifier=detector.name)]


def check_exit_hang(state: JobState, detector: Detector, now: float) -> list[Decision]:
    if not _active(state, detector) or state.first_success_exit is None:
        return []
    interval = state.settings.flag_value(detector.interval_flag)
    waited = now - state.first_success_exit
    if waited < interval:
        return []
    unfinished = [i.name for i in state.instances.values() if i.status is not InstanceStatus.SUCCEEDED]
    message = (f"the job has not finished {waited:.0f} s after an instance exited successfully; "
               f"still running: {', '.join(unfinished[:10])}" + (" ..." if len(unfinished) > 10 else ""))
    kind, reason, rule = guarded(state, detector.action, detector.reason, detector.name, None, now,
                                 detector.error_source)
    return [make_decision(state, kind, reason, rule, now, fault_key=(detector.name, state.round),
                          source=detector.error_source, message=message, signature=detector.name,
                          category="exit_hang", classifier=detector.name)]


CHECKS = {
    DetectorKind.SILENCE: check_silence,
    DetectorKind.EXIT_HANG: check_exit_hang,
}


def check_timers(state: JobState, now: float) -> list[Decision]:
    for detector in state.pack.detectors:
        decisions = CHECKS[detector.kind](state, detector, now)
        if decisions:
            return decisions  # one job-level action at a time
    return []


def next_deadline(state: JobState) -> Optional[float]:
    """The earliest time a timer could fire if no further event arrives."""
    deadlines = []
    for detector in state.pack.detectors:
        if detector.kind is DetectorKind.SILENCE:
            deadline = silence_deadline(state, detector)
        elif _active(state, detector) and state.first_success_exit is not None:
            deadline = state.first_success_exit + state.settings.flag_value(detector.interval_flag)
        else:
            deadline = None
        if deadline is not None:
            deadlines.append(deadline)
    if state.pending_failures is not None:
        deadlines.append(state.pending_failures.deadline)
    return min(deadlines) if deadlines else None
