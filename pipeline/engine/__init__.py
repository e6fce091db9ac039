"""The pure decision core. Import ``step`` and ``start_job`` from here."""

from pipeline.engine.core import start_job, step
from pipeline.engine.state import InstanceStatus, JobState, JobStatus
from pipeline.engine.timers import next_deadline

__all__ = ["InstanceStatus", "JobState", "JobStatus", "next_deadline", "start_job", "step"]
