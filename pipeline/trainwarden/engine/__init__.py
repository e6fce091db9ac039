"""The pure decision core. Import ``step`` and ``start_job`` from here."""

from trainwarden.engine.core import fail_for_engine_error, rebase_times, replay_decision, start_job, step
from trainwarden.engine.state import InstanceStatus, JobState, JobStatus
from trainwarden.engine.timers import next_deadline

__all__ = ["InstanceStatus", "JobState", "JobStatus", "fail_for_engine_error", "next_deadline", "rebase_times",
           "replay_decision", "start_job", "step"]
