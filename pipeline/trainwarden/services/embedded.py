"""``trainwarden run``: one job on this machine, no servers.

The loop is thin: take the next event (process output, exits, SDK messages,
or a tick when nothing came for a while), step the engine, hand decisions to
the actuator. Everything else lives in the runtime, the engine and the store.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import threading
import traceback
from typing import Optional, Protocol

from trainwarden.actuator import Actuator
from trainwarden.diagnose.c4d import C4DFormatError, Finding, parse_line
from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S, DEFAULT_TOOLS, snapshot
from trainwarden.engine import JobState, JobStatus, start_job, step
from trainwarden.engine.decide import apply, make_decision
from trainwarden.events import (
    Decision,
    DecisionKind,
    Diagnosis,
    ErrorSource,
    Event,
    JobSubmitted,
    LogLine,
    Reason,
    SpotBid,
    Tick,
    action_id,
)
from trainwarden.jobspec import JobDefinition
from trainwarden.notify.bridge import DecisionNotifications, NotifyOptions, report_summary
from trainwarden.rules.model import RulePack
from trainwarden.runtime.c4d_source import FileFollower
from trainwarden.runtime.clock import now as clock_now
from trainwarden.runtime.control import ControlServer, PendingReply
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.launcher import LocalJobRunner
from trainwarden.spot.market import MarketProvider
from trainwarden.spot.poller import MarketPoller
from trainwarden.store.records import DeadLetter, DiagnosisRecord, JobRecord, StackReportRecord

TICK_S = 0.2  # bounds detection latency of the timers to well under a second


class Reporter(Protocol):
    def line(self, event: LogLine) -> None: ...
    def flush(self) -> None: ...
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
        self._lock = threading.Lock()  # SDK refusals are written from the control server's threads

    def write(self, records: list) -> None:
        with self._lock:
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


class _CurrentHistory:
    """The run's history writer as it is at each write (it is wrapped for
    retries once the job is running)."""

    def __init__(self, run: "EmbeddedRun"):
        self.run = run

    def write(self, records: list) -> None:
        self.run.history.write(records)


@dataclasses.dataclass
class RunResult:
    job_id: str
    status: str  # succeeded, failed, cancelled
    reason: str
    rounds: int
    decisions: int
    dead_letters: int
    counters: dict = dataclasses.field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == JobStatus.SUCCEEDED.value else 1


class EmbeddedRun:
    def __init__(self, job: JobDefinition, pack: RulePack, history: HistoryWriter, reporter: Reporter,
                 node: Optional[str] = None, tick_s: float = TICK_S,
                 stack_tools: tuple[str, ...] = DEFAULT_TOOLS, stack_timeout_s: float = DEFAULT_TIMEOUT_S,
                 c4d_log: Optional[str] = None, notify: Optional[NotifyOptions] = None,
                 market: Optional[MarketProvider] = None, spot: tuple[SpotBid, ...] = ()):
        self.job = job
        self.pack = pack
        self.history = history
        self.reporter = reporter
        self.node = node or socket.gethostname()
        self.tick_s = tick_s
        self.inbox = Inbox()
        self.state: Optional[JobState] = None
        self.decisions = 0
        self.dead_letters = 0
        self.submitted_at = clock_now()
        self._runner: Optional[LocalJobRunner] = None
        self.stack_tools = stack_tools
        self.stack_timeout_s = stack_timeout_s
        self.stack_reports: list = []
        self.c4d_log = c4d_log
        self.notify_options = notify
        self.notifications: Optional[DecisionNotifications] = None
        # Spot jobs: the bids (checked against the market) and the market, polled here at the edge.
        self.spot = spot
        self.market = MarketPoller(market, job.job_id, self.submitted_at, on_error=reporter.info) \
            if market is not None and spot else None

    def run(self) -> RunResult:
        if self.notify_options is not None:
            # Before anything starts: a queue directory held by another notifier is a usage problem.
            self.notifications = DecisionNotifications(
                self.notify_options, _CurrentHistory(self), self.reporter.info,
                context={"framework": self.job.framework, "instances": len(self.job.instances()),
                         "supervisor_node": self.node})
        # The first write fails loudly (a wrong --store is a usage problem);
        # later ones must not stop a running job.
        try:
            self._write_job("running")
        except BaseException:
            if self.notifications is not None:
                self.notifications.notifier.close()
            raise
        self.history = RetryingHistory(self.history, self.reporter)
        control = ControlServer(deliver=self.inbox.put, on_refused=self._refused)
        runner = self._runner = LocalJobRunner(self.job, self.inbox.put, control, self.node,
                                               line_sink=self.inbox.offer_line)
        actuator = Actuator(runner, self.history, self.node, clock=clock_now)
        # The diagnostic channel: only this file, never the job's own output, may isolate a node.
        follower = FileFollower(self.c4d_log, self._c4d_line) if self.c4d_log else None
        status = None
        try:
            submitted = JobSubmitted(job_id=self.job.job_id, time=self.submitted_at, framework=self.job.framework,
                                     args=self.job.args, instances=self.job.instances(), spot=self.spot)
            self.state, first = start_job(submitted, self.pack, self.submitted_at)
            self._handle(first, actuator)  # START_JOB starts the instances (a spot job queues)
            self._poll_market(actuator, clock_now())
            self._loop(actuator)
            status = self.state.status.value
        except KeyboardInterrupt:
            status = "cancelled"
            self._escalate_further_signals(runner)
            self.reporter.info("interrupted: stopping every instance (interrupt again to kill them at once)")
        finally:
            try:
                if follower is not None:
                    follower.close()
                actuator.finish()
                runner.close()
            finally:
                control.close()
                self.reporter.flush()
                final = status or "failed"
                self._write_job(final)
                self._close_notifications()
                if self.history.backlog:
                    self.reporter.info(f"{len(self.history.backlog)} history records could not be written")
        counters = dataclasses.asdict(runner.runtime.counters)
        return RunResult(self.job.job_id, final, self.state.final_reason if self.state else "",
                         self.state.job_restarts if self.state else 0, self.decisions, self.dead_letters, counters)

    def _close_notifications(self) -> None:
        """The last deliveries, after the job's outcome is stored: waiting for a
        slow receiver (or an interrupt while waiting) cannot lose that."""
        if self.notifications is None:
            return
        try:
            self.notifications.close()
        except KeyboardInterrupt:
            self.notifications.notifier.close(timeout_s=1.0)
            self.reporter.info(f"interrupted: notifications still pending stay queued in "
                               f"{self.notifications.options.directory}")

    def _escalate_further_signals(self, runner: LocalJobRunner) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def kill_now(signum, frame):
            runner.runtime.kill_all()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, kill_now)

    def _loop(self, actuator: Actuator) -> None:
        next_tick = clock_now() + self.tick_s
        while not self.state.finished:
            item = self.inbox.get(timeout_s=max(0.0, next_tick - clock_now()))
            if item is None:
                self.reporter.flush()
            else:
                self._process(item, actuator)
            moment = clock_now()
            if moment >= next_tick and not self.state.finished:
                # Timers judge the job as of the oldest evidence not yet read,
                # never past it: a backlog delays detection, it cannot fake it.
                oldest = self.inbox.oldest_time()
                watermark = moment if oldest is None else min(moment, oldest)
                self._process(Tick(job_id=self.job.job_id, time=watermark), actuator, now=watermark)
                self._poll_market(actuator, moment)
                self.reporter.flush()
                next_tick = moment + self.tick_s

    def _poll_market(self, actuator: Actuator, moment: float) -> None:
        if self.market is None or self.state.finished:
            return
        update = self.market.poll(moment)
        if update is not None:
            self._process(update, actuator, now=moment)

    def _process(self, item: Event | PendingReply, actuator: Actuator, now: Optional[float] = None) -> None:
        reply = item if isinstance(item, PendingReply) else None
        if reply is not None and not reply.take():
            self._dead_letter("sdk", "the SDK caller gave up waiting before the engine took the message",
                              repr(reply.message))
            return
        event = reply.message if reply else item
        if isinstance(event, LogLine):
            self.reporter.line(event)
            if "C4D" in event.text or "c4d" in event.text:
                self._untrusted_c4d(event)
        try:
            self.state, decisions = step(self.state, event, clock_now() if now is None else now)
        except Exception as exc:  # a bug must not lose the event or leave the job unsupervised
            self._dead_letter("engine", f"engine step failed: {exc!r}", repr(event) + "\n" + traceback.format_exc())
            if reply:
                reply.resolve(False, "the engine could not take this message; it was kept as a dead letter")
            decisions = [self._engine_failure(exc)]
        else:
            if reply:
                reply.resolve(True, "taken")
            if isinstance(event, LogLine):
                actuator.observe(event)
            elif isinstance(event, Diagnosis):
                self._record_diagnosis(event, True, "+".join(d.kind.value for d in decisions) or "recorded")
        self._handle(decisions, actuator)

    def _engine_failure(self, exc: Exception) -> Decision:
        """The engine's state can no longer be trusted: fail the job, saying why."""
        decision = make_decision(self.state, DecisionKind.FAIL_JOB, Reason.ENGINE_ERROR, "engine_error",
                                 clock_now(), fault_key=("engine_error",), message=f"engine error: {exc!r}")
        apply(self.state, decision)
        return decision

    def _handle(self, decisions: list[Decision], actuator: Actuator) -> None:
        for decision in decisions:
            self.decisions += 1
            try:
                self.reporter.decision(decision)
            except Exception:  # noqa: BLE001 - printing must never stop an action
                pass
            report = None
            if decision.error_source in (ErrorSource.HANG, ErrorSource.EXIT_HANG) and decision.kind in (
                    DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB):
                report = self._stack_report(decision)
            actuator.execute(decision)
            if self.notifications is not None:
                self.notifications.decision(decision, report)

    def _c4d_line(self, line: str) -> None:
        """A line of the C4D agent's log (its own thread): a finding goes to the engine."""
        try:
            finding = parse_line(line)
        except C4DFormatError as exc:
            self._dead_letter("c4d", str(exc), line)
            return
        if finding is not None:
            self.inbox.put(self._diagnosis(finding))

    def _diagnosis(self, finding: Finding) -> Diagnosis:
        return Diagnosis(job_id=self.job.job_id, time=clock_now(), node=finding.node or self.node, source="c4d",
                         kind=finding.kind, level=finding.level, rank=finding.rank, detail=finding.detail)

    def _untrusted_c4d(self, event: LogLine) -> None:
        try:
            finding = parse_line(event.text)
        except C4DFormatError:
            return
        if finding is not None:
            # Anyone can print this; only the diagnostic channel may act on it.
            self._record_diagnosis(self._diagnosis(finding), False,
                                   f"recorded only: printed by {event.instance}, not the C4D channel")

    def _record_diagnosis(self, event: Diagnosis, trusted: bool, action: str) -> None:
        self.history.write([DiagnosisRecord(
            diagnosis_id=action_id(event.job_id, "diagnosis", event.time, event.node, event.kind, event.level, trusted),
            job_id=event.job_id, time=event.time, node_name=event.node, source=event.source, kind=event.kind,
            level=event.level, rank=event.rank, detail=event.detail, trusted=trusted, action=action,
            updated_at=clock_now())])

    def _stack_report(self, decision: Decision) -> Optional[dict]:
        """The stacks of the hung job, taken before the restart ends it; the
        summary the hang notification carries."""
        if self._runner is None or not self.stack_tools:
            return None
        try:
            report = snapshot(self._runner.tokens(), self.stack_tools, self.stack_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis must not stop the restart
            self.reporter.info(f"stack snapshot failed: {exc!r}")
            return None
        self.stack_reports.append(report)
        self.reporter.info(report.text())
        now = clock_now()
        self.history.write([StackReportRecord(
            report_id=decision.action_id, record_id=decision.action_id, job_id=decision.job_id, time=now,
            round=decision.round, tool=report.tool, processes=report.processes, groups=len(report.groups),
            suspects=",".join(report.suspects), verdict=report.verdict[:2000], missing="; ".join(report.missing)[:4000],
            report_json=report.to_json()[:1_000_000], updated_at=now)])
        return report_summary(report.tool, report.processes, len(report.groups), report.suspects, report.verdict,
                              report.missing)

    def _refused(self, reason: str, raw: bytes) -> None:
        self._dead_letter("sdk", reason, raw.decode("utf-8", errors="replace"))

    def _dead_letter(self, source: str, error: str, payload: str) -> None:
        self.dead_letters += 1
        self.history.write([DeadLetter(time=clock_now(), source=source, job_id=self.job.job_id,
                                       error=error[:2000], payload=payload[:16000])])

    def _write_job(self, status: str) -> None:
        now = clock_now()
        finished = 0.0 if status == "running" else now
        self.history.write([JobRecord(
            job_id=self.job.job_id, submitted_at=self.submitted_at, finished_at=finished, status=status,
            reason=self.state.final_reason if self.state else "", framework=self.job.framework,
            args=self.job.args, instances=len(self.job.instances()),
            rounds=self.state.job_restarts if self.state else 0, node_name=self.node, updated_at=now,
        )])
