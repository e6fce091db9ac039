"""Submitting a job to the cluster and following it to its end."""

from __future__ import annotations

import time

import msgspec
from typing import Callable, Optional

from trainwarden.actuator import wants_stack_report
from trainwarden.bus import ACTUATOR_STATE, DECISIONS, EVENTS, LOGS, Bus
from trainwarden.bus.messages import LogBatch, NodeLogBatch, StackReportReady, WireLogLine
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.clock import now as clock_now
from trainwarden.events import Decision, DecisionKind, JobSubmitted, LogLine, SpotBid
from trainwarden.jobspec import JobDefinition


def job_submitted(job: JobDefinition, spot: tuple[SpotBid, ...] = ()) -> JobSubmitted:
    """spot: the bids checked against the market (spot/spec.py check_bids);
    their pools go in the spec too, for the runtime that places the roles."""
    spec = job.spec()
    if any(bid.pool for bid in spot):
        spec = msgspec.structs.replace(spec, spot_pools=tuple((bid.role, bid.pool) for bid in spot if bid.pool))
    return JobSubmitted(job_id=job.job_id, time=clock_now(), framework=job.framework, args=job.args,
                        instances=job.instances(), spec=spec, activity_reports=True, spot=spot)


def submit(bus: Bus, job: JobDefinition, spot: tuple[SpotBid, ...] = ()) -> None:
    producer = bus.producer()
    try:
        producer.send(EVENTS, job.job_id, encode(job_submitted(job, spot)))
        producer.flush(30)
    finally:
        producer.close()


# A hang that ends the job: the actuator dumps the stacks before it stops the
# instances, so the report comes after the decision; wait this long for it
# (stack dumps are bounded by the agents' --stack-timeout, 10 s by default).
REPORT_WAIT_S = 30.0


class Follower:
    """Streams one job's output, decisions and stack reports; ends at its last
    decision (and the stack report of a hang that ended the job)."""

    def __init__(self, bus: Bus, job_id: str):
        self.job_id = job_id
        # The actuator's state topic carries the stack reports' summaries (keyed by report, not by job).
        self.consumer = bus.consumer([LOGS, DECISIONS, ACTUATOR_STATE], None, from_beginning=False)
        self.outcome: Optional[Decision] = None
        self.reports: dict[str, StackReportReady] = {}

    def ready(self, timeout_s: float = 30.0) -> bool:
        """Partitions assigned: nothing produced from now on will be missed."""
        deadline = time.monotonic() + timeout_s
        while not self.consumer.ready() and time.monotonic() < deadline:
            self.consumer.poll(0.1)
        return self.consumer.ready()

    def follow(self, on_line: Callable[[LogLine], None], on_decision: Callable[[Decision], None],
               timeout_s: Optional[float] = None,
               on_report: Callable[[StackReportReady], None] = lambda report: None) -> Optional[Decision]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._over() and (deadline is None or time.monotonic() < deadline):
            for record in self.consumer.poll(0.2, max_records=2000):
                if record.key != self.job_id and record.topic != ACTUATOR_STATE:
                    continue
                try:
                    message = decode(record.topic, record.value)
                except DecodeError:
                    continue
                if record.topic == ACTUATOR_STATE:
                    if isinstance(message, StackReportReady) and message.job_id == self.job_id:
                        self.reports[message.report_id] = message
                        on_report(message)
                    continue
                if record.topic == DECISIONS:
                    if not isinstance(message, Decision):
                        continue  # the processor's history rows, for the actuator
                    on_decision(message)
                    if message.kind in (DecisionKind.COMPLETE_JOB, DecisionKind.FAIL_JOB):
                        self.outcome = message
                        self._ended_at = time.monotonic()
                else:
                    for line in _lines(message):
                        on_line(line)
        return self.outcome

    def _over(self) -> bool:
        if self.outcome is None:
            return False
        if not wants_stack_report(self.outcome) or self.outcome.action_id in self.reports:
            return True
        return time.monotonic() - self._ended_at > REPORT_WAIT_S

    def close(self) -> None:
        self.consumer.close()


def _lines(message) -> list[LogLine]:
    if isinstance(message, WireLogLine):
        return [LogLine(job_id=message.job_id, time=message.time, instance=message.instance, round=message.round,
                        start=message.start, text=message.text, stream=message.stream)]
    if isinstance(message, LogBatch):
        return [LogLine(job_id=message.job_id, time=line.time, instance=message.instance, round=message.round,
                        start=message.start, text=line.text, stream=line.stream) for line in message.lines]
    if isinstance(message, NodeLogBatch):
        return [LogLine(job_id=message.job_id, time=line.time, instance=part.instance, round=part.round,
                        start=part.start, text=line.text, stream=line.stream)
                for part in message.parts for line in part.lines]
    return []


def line_event(line: LogLine) -> dict:
    """An output line as one JSON-lines event (``submit --follow --json``)."""
    return {"event": "line", "job_id": line.job_id, "time": line.time, "instance": line.instance,
            "round": line.round, "start": line.start, "stream": line.stream.value, "text": line.text}


def decision_event(decision: Decision) -> dict:
    """A decision as one JSON-lines event: its fields as on the bus (docs/MESSAGES.md)."""
    fields = msgspec.to_builtins(decision)
    # How to start the instances is the actuator's business, and long.
    for bulky in ("spec", "instances", "starts"):
        fields.pop(bulky, None)
    return {"event": "decision", **fields}
