"""Whether a restart got the job anywhere: the no-progress guard.

A fault that comes back after every restart before the job gets any
further is the job's own, whatever its verdict says: a rendezvous that
times out because the job asks for a rank that never comes, a host OOM
kill at the same step because the batch does not fit, a time limit the job
can never finish in. The lines of one failure often cannot tell these from
a transient fault (the same line is both in real threads); what tells them
apart is that the restarts make no progress.

Progress, for what a restart ends (the round of a job restart, the
incarnation of an instance restart):
- the job reports how far it got (SDK ``report_progress``): it made
  progress when it reported a step higher than any before it began;
- the job never reports: it made progress when it ran at least the rule
  pack's ``progress_min_run_s`` (a crash loop fails at start-up).

Each restart for a fault of the job's own (its instances' exits, its
hangs) that made none counts; one that made progress starts the count
again. Node loss, C4D's findings and preemptions are the infrastructure's:
they neither count nor, unless the job got further, clear the count. The
``no_progress_restarts`` counter of the limits is the count the restart
being judged would make. Pure: time comes in as ``now``.
"""

from __future__ import annotations

from typing import Optional

from trainwarden.engine.state import InstanceState, InstanceStatus, JobState
from trainwarden.events import DecisionKind, ErrorSource

# Faults that tell of the job itself; the others are the infrastructure's.
JOB_FAULTS = frozenset({ErrorSource.INSTANCE_EXIT, ErrorSource.HANG, ErrorSource.EXIT_HANG})

__all__ = ["made_progress", "no_progress_count", "note_progress", "note_restart"]


def _alone(intent: DecisionKind, inst: Optional[InstanceState]) -> bool:
    """Whether the restart ends one instance's incarnation rather than the round."""
    return intent is DecisionKind.RESTART_INSTANCE and inst is not None


def _round_run_s(state: JobState, now: float) -> float:
    started = [i.started_at for i in state.instances.values() if i.status is not InstanceStatus.PENDING]
    return now - min(started) if started else 0.0


def made_progress(state: JobState, intent: DecisionKind, inst: Optional[InstanceState], now: float) -> bool:
    """Whether what ``intent`` would end (the round, or ``inst``'s incarnation) got the job further."""
    if _alone(intent, inst):
        if inst.best_step >= 0:
            return inst.best_step > inst.best_at_start
        if inst.status is InstanceStatus.PENDING:
            return False
        return now - inst.started_at >= state.pack.progress_min_run_s
    if state.best_step >= 0:
        return state.best_step > state.round_best_at_start
    return _round_run_s(state, now) >= state.pack.progress_min_run_s


def no_progress_count(state: JobState, intent: DecisionKind, inst: Optional[InstanceState], now: float,
                      source: Optional[ErrorSource]) -> int:
    """Restarts in a row that made no progress, counting the one ``intent``
    asks for if a fault of the job's own ends it (0 if it made progress)."""
    if made_progress(state, intent, inst, now):
        return 0
    count = inst.no_progress_restarts if _alone(intent, inst) else state.no_progress_restarts
    return count + 1 if source in JOB_FAULTS else count


def note_progress(state: JobState, inst: Optional[InstanceState], step: int) -> None:
    """The job said it got to ``step``."""
    state.best_step = max(state.best_step, step)
    if inst is not None:
        inst.best_step = max(inst.best_step, step)


def note_restart(state: JobState, kind: DecisionKind, source: Optional[ErrorSource], inst: Optional[InstanceState],
                 now: float) -> None:
    """Before a restart is applied: count it, and start measuring the next round or incarnation."""
    count = no_progress_count(state, kind, inst, now, source)
    if _alone(kind, inst):
        inst.no_progress_restarts = count
        inst.best_at_start = inst.best_step
        return
    state.no_progress_restarts = count
    state.round_best_at_start = state.best_step
    for each in state.instances.values():
        each.best_at_start = each.best_step
