"""Guards in front of restarts: the rule pack's ``limits`` section.

``first_limit_reached`` returns the first limit that holds for a restart the
engine is about to ask for; the caller turns the restart into ``fail_job``
with that limit's reason. Counters include the fault being judged.
"""

from __future__ import annotations

from typing import Optional

from trainwarden.engine.progress import no_progress_count
from trainwarden.engine.state import InstanceState, JobState
from trainwarden.events import DecisionKind, ErrorSource
from trainwarden.rules.model import Counter, Limit, LimitKind


def counter_value(state: JobState, limit: Limit, intent: DecisionKind, inst: Optional[InstanceState],
                  signature: str, now: float, source: Optional[ErrorSource]) -> Optional[float]:
    counter = limit.counter
    if counter is Counter.NO_PROGRESS_RESTARTS:
        return no_progress_count(state, intent, inst, now, source)
    if counter is Counter.JOB_RESTARTS:
        return state.job_restarts + 1
    if counter is Counter.INSTANCE_RESTARTS:
        return None if inst is None else inst.restarts + 1
    if counter is Counter.SAME_ERROR:
        return None if inst is None or not signature else inst.error_counts.get(signature, 0)
    if counter is Counter.FAILED_INSTANCE_RATIO:
        pool = [i for i in state.instances.values() if not limit.roles or i.role in limit.roles]
        if not pool:
            return None
        return sum(1 for i in pool if i.ever_failed) / len(pool)
    return None


def first_limit_reached(state: JobState, intent: DecisionKind, inst: Optional[InstanceState],
                        signature: str, now: float, source: Optional[ErrorSource]) -> Optional[Limit]:
    for limit in state.pack.limits:
        if intent not in limit.applies_to:
            continue
        if limit.kind is LimitKind.FLAG_REQUIRED:
            if not state.settings.flag_value(limit.flag):
                return limit
            continue
        maximum = state.settings.flag_value(limit.flag)
        if maximum < 0:
            continue  # -1 switches the limit off
        value = counter_value(state, limit, intent, inst, signature, now, source)
        if value is not None and value > maximum:
            return limit
    return None
