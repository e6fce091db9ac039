"""``trainwarden run``: one job on this machine, no servers.

The run is a service of the one service loop (services/loop.py): an
iteration takes the next event (process output, exits, SDK messages) and
steps the engine with it, a tick (every ``TICK_S``) runs the timers, and the
decisions go to the actuator. Everything else lives in the runtime, the
engine and the store.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Optional, Protocol

import msgspec

from trainwarden.clock import now as clock_now
from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S, DEFAULT_TOOLS
from trainwarden.engine import JobState, JobStatus, start_job
from trainwarden.events import Decision, Event, InstanceExited, InstanceStarted, JobSubmitted, LogLine, SpotBid, Tick
from trainwarden.jobspec import JobDefinition
from trainwarden.notify.bridge import DecisionNotifications, NotifyOptions, report_summary
from trainwarden.rules.model import RulePack
from trainwarden.runtime.c4d_source import open_channel
from trainwarden.runtime.control import ControlServer, PendingReply
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.keeper_lease import KeeperLease
from trainwarden.runtime.launcher import InstanceLogs, LocalJobRunner
from trainwarden.runtime.run_as import RunAs
from trainwarden.runtime.logfiles import LogFileLimits
from trainwarden.services.loop import ServiceLoop
from trainwarden.spot.market import MarketProvider
from trainwarden.spot.poller import MarketPoller
from trainwarden.store.base import StoreError
from trainwarden.store.records import DeadLetter, JobRecord
from trainwarden.store.spool import SpoolWriter
from trainwarden.supervision.acting import JobFacts, Supervisor
from trainwarden.supervision.intake import channel_line, dead_letter, refused_request, take
from trainwarden.supervision.stack_reports import StackReports

# How long a finished run keeps retrying history records it could not write
# (a full disk) before it gives up and says how many were lost.
HISTORY_WAIT_S = 60.0
_HISTORY_RETRY_S = 0.5


class Reporter(Protocol):
    """What a run tells its user. A reporter may also have ``lifecycle(event)``
    for instance starts and exits (the JSON lines of ``run -o json`` do)."""

    def line(self, event: LogLine) -> None: ...
    def flush(self) -> None: ...
    def decision(self, decision: Decision) -> None: ...
    def info(self, text: str) -> None: ...


class HistoryWriter(Protocol):
    def write(self, records: list) -> None: ...


class RetryingHistory:
    """A history writer that never stops the job's supervision: a failed
    write (disk full, store removed) is kept and retried with the next one,
    oldest first, and reported once per outage. At most MAX_BACKLOG records
    wait; beyond that the oldest are dropped, and counted."""

    MAX_BACKLOG = 100_000
    # Records per retried segment: a disk with a little room again takes some.
    CHUNK = 1_000

    def __init__(self, inner: HistoryWriter, reporter: "Reporter"):
        self.inner = inner
        self.reporter = reporter
        self.backlog: list = []
        self.failed_writes = 0
        self.dropped = 0
        self.reason = ""  # why the last write failed
        self._failing = False
        self._lock = threading.Lock()  # SDK refusals are written from the control server's threads

    def write(self, records: list) -> None:
        with self._lock:
            self.backlog.extend(records)
            self._drain()

    def retry(self) -> bool:
        """One more attempt at the kept records; True once none is left."""
        with self._lock:
            return self._drain()

    def _drain(self) -> bool:
        while self.backlog:
            chunk = self.backlog[: self.CHUNK]
            try:
                self.inner.write(chunk)
            except Exception as exc:  # noqa: BLE001 - any store failure is reported, never fatal here
                self._failed(exc)
                return False
            del self.backlog[: len(chunk)]
        if self._failing:
            self._failing = False
            self.reporter.info("history writes work again; the kept records are written")
        return True

    def _failed(self, exc: Exception) -> None:
        self.failed_writes += 1
        self.reason = _write_failure(exc)
        if not self._failing:
            self._failing = True
            self.reporter.info(f"history write failed ({str(exc).rstrip('.')}); records are kept and retried")
        overflow = len(self.backlog) - self.MAX_BACKLOG
        if overflow > 0:
            if not self.dropped:
                self.reporter.info(f"more than {self.MAX_BACKLOG} history records wait to be written: the oldest "
                                   f"are dropped from now on, and counted")
            del self.backlog[:overflow]
            self.dropped += overflow


def _write_failure(exc: Exception) -> str:
    """The system's reason (``No space left on device``) when there is one."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(exc).rstrip(".")


class _CurrentHistory:
    """The run's history writer as it is at each write (it is wrapped for
    retries once the job is running)."""

    def __init__(self, run: "EmbeddedRun"):
        self.run = run

    def write(self, records: list) -> None:
        self.run.history.write(records)
        if self.run.epitaph is not None:
            self.run.epitaph.remember(records)


class _Epitaph:
    """What the history says if this process dies before the run ends (a
    SIGKILL runs none of our code): the keeper publishes the job's last
    running record as failed, ``supervisor_died``, instead of leaving the job
    running forever."""

    REASON = "supervisor_died"

    def __init__(self, writer: SpoolWriter):
        self.writer = writer
        self.name = f"epitaph-{os.getpid()}-{secrets.token_hex(4)}"
        self.lease = KeeperLease(self.name)
        self.held: Optional[Path] = None

    def remember(self, records: list) -> None:
        running = [r for r in records if isinstance(r, JobRecord) and r.status == JobStatus.RUNNING.value]
        if not running:
            return
        ended = msgspec.structs.replace(running[-1], status=JobStatus.FAILED.value, reason=self.REASON)
        try:
            held = self.writer.hold([ended], self.name)
        except StoreError:
            return  # a full disk, say: the epitaph before this one stays
        if self.held is None:
            self.lease.epitaph(held)
        self.held = held

    def spare(self) -> None:
        """The run ends itself and writes its own last record."""
        self.lease.spare()
        if self.held is not None:
            try:
                self.held.unlink(missing_ok=True)
            except OSError:
                pass
        self.lease.close()


@dataclasses.dataclass
class RunResult:
    job_id: str
    status: JobStatus
    reason: str
    rounds: int  # job restarts, as the jobs table counts them (supervision/acting.py)
    decisions: int
    dead_letters: int
    counters: dict = dataclasses.field(default_factory=dict)
    lost_records: int = 0  # history records never written (a full disk that stayed full)

    @property
    def exit_code(self) -> int:
        return 0 if self.status is JobStatus.SUCCEEDED and not self.lost_records else 1


class EmbeddedRun:
    def __init__(self, job: JobDefinition, pack: RulePack, history: HistoryWriter, reporter: Reporter,
                 node: Optional[str] = None,
                 stack_tools: tuple[str, ...] = DEFAULT_TOOLS, stack_timeout_s: float = DEFAULT_TIMEOUT_S,
                 c4d_log: Optional[str] = None, c4d_socket: Optional[str] = None,
                 notify: Optional[NotifyOptions] = None,
                 market: Optional[MarketProvider] = None, spot: tuple[SpotBid, ...] = (),
                 log_dir: Optional[str] = None, history_wait_s: float = HISTORY_WAIT_S,
                 run_as: Optional[RunAs] = None, log_limits: LogFileLimits = LogFileLimits()):
        self.job = job
        self.run_as = run_as  # the user the instances run as (runtime/run_as.py)
        self.pack = pack
        self.history = history
        self.reporter = reporter
        self.node = node or socket.gethostname()
        self.inbox = Inbox()
        self.state: Optional[JobState] = None
        self.decisions = 0
        self.dead_letters = 0
        self.submitted_at = clock_now()
        self._runner: Optional[LocalJobRunner] = None
        self.stack_tools = stack_tools
        self.stack_timeout_s = stack_timeout_s
        self.stack_reports: list = []
        self._report_summaries: dict[str, dict] = {}
        self.supervisor: Optional[Supervisor] = None
        self.c4d_log = c4d_log
        self.c4d_socket = c4d_socket
        self.notify_options = notify
        self.notifications: Optional[DecisionNotifications] = None
        # Spot jobs: the bids (checked against the market) and the market, polled here at the edge.
        self.spot = spot
        self.market = MarketPoller(market, job.job_id, self.submitted_at, on_error=reporter.info) \
            if market is not None and spot else None
        self.logs = InstanceLogs(log_dir, reporter.info, log_limits) if log_dir else None
        self._lifecycle = getattr(reporter, "lifecycle", None)
        self.history_wait_s = history_wait_s
        self.epitaph: Optional[_Epitaph] = None
        self._hurry = False  # a further interrupt while the run ends: stop waiting for the history

    def run(self) -> RunResult:
        if self.notify_options is not None:
            # Before anything starts: a queue directory held by another notifier is a usage problem.
            self.notifications = DecisionNotifications(
                self.notify_options, _CurrentHistory(self), self.reporter.info,
                context={"framework": self.job.framework, "instances": len(self.job.instances()),
                         "supervisor_node": self.node})
        facts = JobFacts(job_id=self.job.job_id, submitted_at=self.submitted_at, framework=self.job.framework,
                         args=self.job.args, instances=len(self.job.instances()), node_name=self.node)
        reports = StackReports(_CurrentHistory(self), clock_now, announce=self._stack_report)
        control = ControlServer(deliver=self.inbox.put, on_refused=self._refused)
        if self.run_as is not None:
            self.run_as.share_socket(control.path)
        runner = self._runner = LocalJobRunner(self.job, self.inbox.put, control, self.node,
                                               line_sink=self.inbox.offer_line, reports=reports,
                                               stack_tools=self.stack_tools, stack_timeout_s=self.stack_timeout_s,
                                               say=self.reporter.info, run_as=self.run_as)
        supervisor = self.supervisor = Supervisor(runner, _CurrentHistory(self), reports, facts, node=self.node,
                                                  clock=clock_now, notify=self._notify)
        # The first write fails loudly (a wrong --store is a usage problem);
        # later ones must not stop a running job.
        self.epitaph = _Epitaph(self.history) if isinstance(self.history, SpoolWriter) else None
        try:
            supervisor.write_job(JobStatus.RUNNING)
        except BaseException:
            self._spare_epitaph()
            control.close()
            runner.close()
            if self.notifications is not None:
                self.notifications.notifier.close()
            raise
        self.history = RetryingHistory(self.history, self.reporter)
        # The diagnostic channel: only C4D's collector, never the job's own output, may isolate a node.
        follower = self._c4d_channel(control)
        status = None
        try:
            submitted = JobSubmitted(job_id=self.job.job_id, time=self.submitted_at, framework=self.job.framework,
                                     args=self.job.args, instances=self.job.instances(), spot=self.spot)
            # The arguments as parsed where the job was defined (jobspec.py): the one parse.
            self.state, first = start_job(submitted, self.pack, self.submitted_at, settings=self.job.settings)
            self._handle(first)  # START_JOB starts the instances (a spot job queues)
            self._poll_market(clock_now())
            ServiceLoop(self).until(lambda: self.state.finished)
            status = self.state.status
        except KeyboardInterrupt:
            status = JobStatus.CANCELLED
            self._escalate_further_signals(runner)
            self.reporter.info("interrupted: stopping every instance (interrupt again to kill them at once)")
        finally:
            try:
                if follower is not None:
                    follower.close()
                supervisor.finish()
                runner.close()
            finally:
                control.close()
                if self.logs is not None:
                    self.logs.close()
                self.reporter.flush()
                final = status or JobStatus.FAILED
                self._spare_epitaph()
                supervisor.write_job(final, reason=self.state.final_reason if self.state else "")
                self._close_notifications()
                lost = self._settle_history()
        counters = dataclasses.asdict(runner.runtime.counters)
        return RunResult(self.job.job_id, final, self.state.final_reason if self.state else "",
                         supervisor.restarts, self.decisions, self.dead_letters, counters, lost_records=lost)

    def _spare_epitaph(self) -> None:
        if self.epitaph is not None:
            self.epitaph.spare()
            self.epitaph = None

    def _settle_history(self) -> int:
        """Records still unwritten at the end (a full disk) get a bounded
        wait for space, said out loud; how many are lost in the end."""
        history = self.history
        if not isinstance(history, RetryingHistory):
            return 0
        if history.backlog:
            self.reporter.info(f"{len(history.backlog)} history records are not written yet "
                               f"({history.reason}); waiting up to {self.history_wait_s:g} s for space "
                               f"(TRAINWARDEN_HISTORY_WAIT sets how long)")
            self.reporter.flush()
            deadline = time.monotonic() + self.history_wait_s
            try:
                while not history.retry() and time.monotonic() < deadline and not self._hurry:
                    time.sleep(min(_HISTORY_RETRY_S, max(0.0, deadline - time.monotonic())))
            except KeyboardInterrupt:
                pass  # the user would rather stop than wait: what is left is counted below
        lost = len(history.backlog) + history.dropped
        if lost:
            why = [f"{len(history.backlog)} could not be written in {self.history_wait_s:g} s ({history.reason})"] \
                if history.backlog else []
            if history.dropped:
                why.append(f"{history.dropped} were dropped beyond the backlog of {history.MAX_BACKLOG}")
            self.reporter.info(f"{lost} history records of this run were lost: {' and '.join(why)}")
        return lost

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
            self._hurry = True
            runner.runtime.kill_all()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, kill_now)

    # ------------------------------------------------ the loop (services/loop.py)

    def run_once(self, timeout_s: float) -> None:
        """The next event, waiting for it at most ``timeout_s``; the output is flushed when none came."""
        item = self.inbox.get(timeout_s=timeout_s)
        if item is None:
            self._flush()
        else:
            self._process(item)

    def tick(self) -> None:
        """The timers, and the market polled (a spot job)."""
        if self.state.finished:
            return
        moment = clock_now()
        # Timers judge the job as of the oldest evidence not yet read,
        # never past it: a backlog delays detection, it cannot fake it.
        oldest = self.inbox.oldest_time()
        watermark = moment if oldest is None else min(moment, oldest)
        self._process(Tick(job_id=self.job.job_id, time=watermark), now=watermark)
        self._poll_market(moment)
        self._flush()

    def _flush(self) -> None:
        self.reporter.flush()
        if self.logs is not None:
            self.logs.flush()

    def _poll_market(self, moment: float) -> None:
        if self.market is None or self.state.finished:
            return
        update = self.market.poll(moment)
        if update is not None:
            self._process(update, now=moment)

    def _process(self, item: Event | PendingReply | DeadLetter, now: Optional[float] = None) -> None:
        if isinstance(item, DeadLetter):
            self._keep([item])
            return
        reply = item if isinstance(item, PendingReply) else None
        if reply is not None and not reply.take():
            self._keep([dead_letter(self.job.job_id, "sdk",
                                    "the SDK caller gave up waiting before the engine took the message",
                                    repr(reply.message), clock_now())])
            return
        event = reply.message if reply else item
        if isinstance(event, LogLine):
            if self.logs is not None:
                self.logs.write(event)
            self.reporter.line(event)
        elif isinstance(event, (InstanceStarted, InstanceExited)):
            if self.logs is not None and isinstance(event, InstanceExited):
                self.logs.close_incarnation(event.instance, event.round, event.start)
            if self._lifecycle is not None:
                self._lifecycle(event)
        taken = take(self.state, event, clock_now() if now is None else now, node=self.node)
        self.state = taken.state
        self._keep(taken.records)
        if reply:
            if taken.engine_failed:
                reply.resolve(False, "the engine could not take this message; it was kept as a dead letter")
            else:
                reply.resolve(True, "taken")
        if isinstance(event, LogLine) and not taken.engine_failed:
            self.supervisor.observe(event)
        self._handle(taken.decisions)

    def _keep(self, records: list) -> None:
        self.dead_letters += sum(1 for r in records if isinstance(r, DeadLetter))
        self.supervisor.keep(records)

    def _handle(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            self.decisions += 1
            try:
                self.reporter.decision(decision)
            except Exception:  # noqa: BLE001 - printing must never stop an action
                pass
            self.supervisor.act(decision)

    def _notify(self, decision: Decision) -> None:
        if self.notifications is not None:
            self.notifications.decision(decision, self._report_summaries.pop(decision.action_id, None))

    def _c4d_channel(self, control: ControlServer):
        """The socket C4D's collector writes to (the job's processes refused), or its log file."""
        return open_channel(self.c4d_socket, self.c4d_log, self._c4d_line, self._c4d_refused, control)

    def _c4d_refused(self, reason: str, attempt: str) -> None:
        """A job's process wrote to the C4D socket (its thread): a dead letter, in order."""
        self.inbox.put(dead_letter(self.job.job_id, "c4d", reason, attempt, clock_now()))

    def _c4d_line(self, line: str) -> None:
        """A line of the C4D agent's log (its own thread): a finding goes to the engine."""
        found = channel_line(self.job.job_id, line, self.node, clock_now())
        if found is not None:
            self.inbox.put(found)

    def _stack_report(self, ready, report) -> None:
        """The stacks of the hung job, taken before the restart ended it."""
        self.stack_reports.append(report)
        self.reporter.info(report.text())
        self._report_summaries[ready.report_id] = report_summary(
            report.tool, report.processes, len(report.groups), report.suspects, report.verdict, report.missing)

    def _refused(self, reason: str, raw: bytes) -> None:
        # The control server's thread: kept in order with everything else.
        self.inbox.put(refused_request(self.job.job_id, reason, raw, clock_now()))
