"""The scheduler took the job's capacity back: a preemption, not a fault.

A runtime that holds the job's capacity through a scheduler says so
with a ``Preempted`` event when the scheduler requeues or preempts it while
its nodes are up. The round ends without counting toward any limit: the job
restarts (reason ``preempted``, source ``preemption``) and the runtime starts
the new round when the scheduler gives the capacity back. A spot job goes
back to its bidding queue instead; with fault tolerance off the job fails.

The instances' own exits often come first (a scheduler sends SIGTERM as it
preempts): ``failures.py`` holds deaths by an outside SIGTERM for
``platform_notice_window_s`` so that the notice, not the exits, decides.
"""

from __future__ import annotations

from trainwarden.engine import spot
from trainwarden.engine.decide import make_decision
from trainwarden.engine.state import JobState
from trainwarden.events import Decision, DecisionKind, ErrorSource, Preempted, Reason
from trainwarden.settings import FaultTolerantPolicy


def on_preempted(state: JobState, event: Preempted, now: float) -> list[Decision]:
    if event.round != state.round or spot.queued(state):
        return []  # said of a round already over, or of a job that holds nothing
    if state.spot is not None:
        return [spot.preempted(state, event.reason, 0.0, now, event.time)]
    if state.settings.fault_tolerant_policy is FaultTolerantPolicy.NEVER:
        kind, rule, then = DecisionKind.FAIL_JOB, "preempted_no_fault_tolerance", \
            "the job fails (fault tolerance is off: --fault-tolerant-policy=Never)"
    else:
        kind, rule, then = DecisionKind.RESTART_JOB, "platform_preempted", \
            "the job runs again when the scheduler gives the capacity back; no limit counts it"
    return [make_decision(state, kind, Reason.PREEMPTED, rule, now, fault_key=("preempt", state.round),
                          source=ErrorSource.PREEMPTION, message=f"preempted: {event.reason}; {then}",
                          category="preemption", signature="preemption", detected_at=event.time)]
