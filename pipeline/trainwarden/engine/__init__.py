"""The pure decision core. Import ``step`` and ``start_job`` from here."""

from trainwarden.engine.core import start_job, step
from trainwarden.engine.state import InstanceStatus, JobState, JobStatus
from trainwarden.engine.timers import next_deadline

__all__ = ["InstanceStatus", "JobState", "JobStatus", "next_deadline", "start_job", "step"]
