"""``trainwarden run``: one job on this machine, no servers.

The loop is thin: take the next event (process output, exits, SDK messages,
or a tick when nothing came for a while), step the engine, hand decisions to
the actuator. Everything else lives in the runtime, the engine and the store.
"""

from __future__ import annotations

import dataclasses
import queue
import socket
import time
import traceback
from typing import Optional, Protocol

from pipeline.actuator import Actuator
from pipeline.engine import JobState, JobStatus, start_job, step
from pipeline.events import Decision, Event, JobSubmitted, LogLine, Tick
from pipeline.jobspec import JobDefinition
from pipeline.rules.model import RulePack
from pipeline.runtime.control import ControlServer, PendingReply
from pipeline.runtime.launcher import LocalJobRunner
from pipeline.store.records import DeadLetter, JobRecord

TICK_S = 0.2  # bounds detection latency of the timers to well under a second


class Reporter(Protocol):
    def line(self, event: LogLine) -> None: ...
    def decision(self, decision: Decision) -> None: ...
    def info(self, text: str) -> None: ...


class HistoryWriter(Protocol):
    def write(self, records: list) -> None: ...


class RetryingHistory:
    """A history writer that never stops the job's supervision: a failed
    write (disk full, store removed) is kept and retried with the next one,
    and reported once."""

    MAX_BACKLOG = 100_000

    def __init__(self, inner: HistoryWriter, reporter: "Reporter"):
        self.inner = inner
        self.reporter = reporter
        self.backlog: list = []
        self.failed_writes = 0

    def write(self, records: list) -> None:
        self.backlog.extend(records)
        try:
            self.inner.write(self.backlog)
        except Exception as exc:  # noqa: BLE001 - any store failure is reported, never fatal here
            self.failed_writes += 1
            if self.failed_writes == 1:
                self.reporter.info(f"history write failed ({exc}); records are kept and retried")
            del self.backlog[: max(0, len(self.backlog) - self.MAX_BACKLOG)]
            return
        self.backlog = []


@dataclasses.dataclass
class RunResult:
    job_id: str
    status: str  # succeeded, failed, cancelled
    reason: str
    rounds: int
    decisions: int
    dead_letters: int

    @property
    def exit_code(self) -> int:
        return 0 if self.status == JobStatus.SUCCEEDED.value else 1


class EmbeddedRun:
    def __init__(self, job: JobDefinition, pack: RulePack, history: HistoryWriter, reporter: Reporter,
                 node: Optional[str] = None, tick_s: float = TICK_S):
        self.job = job
        self.pack = pack
        self.history = history
        self.reporter = reporter
        self.node = node or socket.gethostname()
        self.tick_s = tick_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.state: Optional[JobState] = None
        self.decisions = 0
        self.dead_letters = 0
        self.submitted_at = time.time()

    def run(self) -> RunResult:
        # The first write fails loudly (a wrong --store is a usage problem);
        # later ones must not stop a running job.
        self._write_job("running")
        self.history = RetryingHistory(self.history, self.reporter)
        control = ControlServer(deliver=self.inbox.put, on_refused=self._refused)
        runner = LocalJobRunner(self.job, self.inbox.put, control, self.node)
        actuator = Actuator(runner, self.history, self.node)
        status = None
        try:
            submitted = JobSubmitted(job_id=self.job.job_id, time=self.submitted_at, framework=self.job.framework,
                                     args=self.job.args, instances=self.job.instances())
            self.state, first = start_job(submitted, self.pack, self.submitted_at)
            self._handle(first, actuator)
            if not self.state.finished:
                actuator.start_all(0)
            self._loop(actuator)
            status = self.state.status.value
        except KeyboardInterrupt:
            status = "cancelled"
            self.reporter.info("interrupted: stopping every instance")
        finally:
            try:
                actuator.finish()
                runner.close()
            finally:
                control.close()
                final = status or "failed"
                self._write_job(final)
                if isinstance(self.history, RetryingHistory) and self.history.backlog:
                    self.reporter.info(f"{len(self.history.backlog)} history records could not be written")
        return RunResult(self.job.job_id, final, self.state.final_reason if self.state else "",
                         self.state.round if self.state else 0, self.decisions, self.dead_letters)

    def _loop(self, actuator: Actuator) -> None:
        next_tick = time.time() + self.tick_s
        while not self.state.finished:
            try:
                item = self.inbox.get(timeout=max(0.0, next_tick - time.time()))
            except queue.Empty:
                item = None
            if item is not None:
                self._process(item, actuator)
            now = time.time()
            if now >= next_tick and not self.state.finished:
                # Lines already read must count before silence is judged.
                while not self.state.finished:
                    try:
                        self._process(self.inbox.get_nowait(), actuator)
                    except queue.Empty:
                        break
                now = time.time()
                self._process(Tick(job_id=self.job.job_id, time=now), actuator)
                next_tick = now + self.tick_s

    def _process(self, item: Event | PendingReply, actuator: Actuator) -> None:
        reply = item if isinstance(item, PendingReply) else None
        event = reply.message if reply else item
        if isinstance(event, LogLine):
            self.reporter.line(event)
        try:
            self.state, decisions = step(self.state, event, time.time())
        except Exception as exc:  # a bug must not lose the event or stop the job's supervision
            self._dead_letter("engine", f"engine step failed: {exc!r}", repr(event) + "\n" + traceback.format_exc())
            if reply:
                reply.resolve(False, "the engine could not take this message; it was kept as a dead letter")
            return
        if reply:
            reply.resolve(True, "taken")
        if isinstance(event, LogLine):
            actuator.observe(event)
        self._handle(decisions, actuator)

    def _handle(self, decisions: list[Decision], actuator: Actuator) -> None:
        for decision in decisions:
            self.decisions += 1
            self.reporter.decision(decision)
            actuator.execute(decision)

    def _refused(self, reason: str, raw: bytes) -> None:
        self._dead_letter("sdk", reason, raw.decode("utf-8", errors="replace"))

    def _dead_letter(self, source: str, error: str, payload: str) -> None:
        self.dead_letters += 1
        self.history.write([DeadLetter(time=time.time(), source=source, job_id=self.job.job_id,
                                       error=error[:2000], payload=payload[:16000])])

    def _write_job(self, status: str) -> None:
        now = time.time()
        finished = 0.0 if status == "running" else now
        self.history.write([JobRecord(
            job_id=self.job.job_id, submitted_at=self.submitted_at, finished_at=finished, status=status,
            reason=self.state.final_reason if self.state else "", framework=self.job.framework,
            args=self.job.args, instances=len(self.job.instances()),
            rounds=self.state.round if self.state else 0, node_name=self.node, updated_at=now,
        )])
