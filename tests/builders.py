"""Event builders for engine tests: a job with a pinned clock."""

from __future__ import annotations

from trainwarden.engine import start_job, step
from trainwarden.events import (
    Activity,
    Decision,
    DecisionKind,
    InstanceActivity,
    InstanceExited,
    InstanceStarted,
    JobSubmitted,
    LogLine,
    SdkMessage,
    SdkOp,
    Tick,
)
from trainwarden.rules.loader import load_rules
from trainwarden.simulation.cluster import instance_specs

PACK = load_rules()
T0 = 1_700_000_000.0


class Job:
    """A job whose instances all start at T0; ``at(seconds)`` pins the clock.

    ``skew_s``: the events' own times are on a clock that far from the
    engine's (an agent's ahead or behind the processor's); ``activity_reports``
    as ``submit`` sets it."""

    def __init__(self, args: str, roles=(("worker", 2),), job_id: str = "job-1", skew_s: float = 0.0,
                 activity_reports: bool = False):
        self.job_id = job_id
        self.now = T0
        self.skew_s = skew_s
        self.state, started = start_job(
            JobSubmitted(job_id=job_id, time=T0 + skew_s, framework="pytorch", args=args,
                         instances=instance_specs(roles), activity_reports=activity_reports), PACK, T0)
        # Faults only: the START_JOB decision is checked by its own tests.
        self.decisions = [d for d in started if d.kind is not DecisionKind.START_JOB]
        for name in self.state.instances:
            self.feed(InstanceStarted(job_id=job_id, time=self.time, instance=name, round=0, start=0))

    def at(self, seconds: float) -> "Job":
        self.now = T0 + seconds
        return self

    @property
    def time(self) -> float:
        """Now on the events' clock."""
        return self.now + self.skew_s

    def feed(self, event) -> list[Decision]:
        self.state, decisions = step(self.state, event, self.now)
        self.decisions.extend(decisions)
        return decisions

    def where(self, name: str) -> dict:
        return {"round": self.state.round, "start": self.state.instances[name].start}

    def tick(self) -> list[Decision]:
        return self.feed(Tick(job_id=self.job_id, time=self.now))

    def log(self, name: str, text: str = "step", said: float | None = None) -> list[Decision]:
        """A line of ``name``; ``said``: when its agent read it (seconds after T0 on the agent's clock)."""
        return self.feed(LogLine(job_id=self.job_id, time=self.time, instance=name, text=text, **self.where(name),
                                 said=None if said is None else T0 + self.skew_s + said))

    def exit(self, name: str, code: int, *tail: str) -> list[Decision]:
        for line in tail:
            self.log(name, line)
        return self.feed(InstanceExited(job_id=self.job_id, time=self.time, instance=name, exit_code=code,
                                        **self.where(name)))

    def sdk(self, name: str, op: SdkOp, **fields) -> list[Decision]:
        return self.feed(SdkMessage(job_id=self.job_id, time=self.time, instance=name, op=op, **fields,
                                    **self.where(name)))

    def activity(self, silent_s: dict, spoke: bool | None = True, node: str = "node-a") -> list[Decision]:
        """An agent's report: each named instance silent for that many seconds (its clock)."""
        return self.feed(InstanceActivity(job_id=self.job_id, time=self.time, node=node, instances=tuple(
            Activity(name, self.state.round, self.state.instances[name].start, self.time - silent,
                     silent_s=silent, spoke=spoke) for name, silent in silent_s.items())))

    def restart_all(self) -> None:
        for name, inst in self.state.instances.items():
            self.feed(InstanceStarted(job_id=self.job_id, time=self.time, instance=name,
                                      round=self.state.round, start=inst.start))
