"""The ``local`` runtime: one job's instances as processes on this machine,
over one node host (runtime/nodehost.py) that starts, stops and dumps them.

Knows the job definition (commands, environment) and turns "start worker-1 in
round 2" into the node host's start order.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Sequence

from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S, DEFAULT_TOOLS
from trainwarden.events import Event, LogLine
from trainwarden.jobspec import JobDefinition
from trainwarden.runtime.base import Capability
from trainwarden.runtime.control import ControlServer
from trainwarden.runtime.environment import free_port, job_env
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.logfiles import InstanceFiles, LogFileCounters, LogFileLimits, log_file
from trainwarden.runtime.nodehost import NodeHost, StartOrder, StopOrder
from trainwarden.runtime.run_as import RunAs

__all__ = ["InstanceLogs", "LocalJobRunner", "log_file"]

MASTER_ADDR = "127.0.0.1"


class LocalJobRunner:
    """The ``local`` runtime: processes on this machine."""

    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.STACK_DUMP,
                              Capability.PREEMPT})

    def __init__(self, job: JobDefinition, sink: Callable[[Event], None], control: ControlServer, node: str,
                 run_dir: Path | None = None, line_sink: Callable[[Event, float], bool] | None = None,
                 reports=None, stack_tools: Sequence[str] = DEFAULT_TOOLS,
                 stack_timeout_s: float = DEFAULT_TIMEOUT_S, say: Callable[[str], None] | None = None,
                 run_as: RunAs | None = None):
        self.job = job
        self.reports = reports  # the job's StackReports: where a hang's dumps go
        self.control = control
        self.node = node
        self._specs = {spec.name: spec for spec in job.instances()}
        self._job_spec = job.spec()
        run_dir = Path(run_dir or tempfile.mkdtemp(prefix=f"trainwarden-{job.job_id}-"))
        # The engine runs in this process: every event goes straight to it (the host follows nothing).
        self.host = NodeHost(node, control, sink, run_dir, line_sink=line_sink, run_as=run_as,
                             say=(lambda job_id, text: say(text)) if say else None, stack_tools=stack_tools,
                             stack_timeout_s=stack_timeout_s, dumps_to=self._hand_in)
        self.runtime: LocalRuntime = self.host.runtime(job.job_id, job.preload)
        self._ports: dict[int, int] = {}

    @property
    def instance_names(self) -> list[str]:
        return list(self._specs)

    def master_port(self, round_: int) -> int:
        # A free port per round: the previous round's port may linger in TIME_WAIT.
        if round_ not in self._ports:
            self._ports[round_] = free_port(MASTER_ADDR)
        return self._ports[round_]

    def start(self, name: str, round_: int, start: int) -> None:
        spec = self._specs[name]
        role = self._job_spec.role(spec.role)
        self.host.start(StartOrder(
            job_id=self.job.job_id, spec=spec, command=tuple(role.command), round=round_, start=start,
            world_size=len(self._specs), max_restarts=self.job.settings.max_num_of_job_restart,
            master_addr=MASTER_ADDR, master_port=self.master_port(round_),
            env=job_env(self._job_spec, role, self.job.settings), workdir=self.job.workdir,
            preload=tuple(self.job.preload)))

    def stop(self, names: Sequence[str], snapshot: str = "", incarnations=None) -> None:
        # One process runs the engine and these instances: what runs is what the decision was about.
        self._stop(tuple(names), snapshot)

    def stop_all(self, snapshot: str = "") -> None:
        self._stop((), snapshot)

    def _stop(self, names: tuple[str, ...], snapshot: str) -> None:
        if snapshot and self.reports is not None:
            self.reports.expect(snapshot, self.job.job_id, self.node)
        else:
            snapshot = ""
        self.host.stop(StopOrder(self.job.job_id, self.job.stop_grace_s, names, report_id=snapshot),
                       background=False)

    def _hand_in(self, job_id: str, report_id: str, dumps: list, missing: list) -> None:
        """The stacks of a hung job, taken before the stop ends it."""
        self.reports.hand_in(self.node, job_id, report_id, dumps, missing)

    def preempt(self, notice_s: float) -> None:
        """The market took the instances back: without notice they die at
        once (SIGKILL); with notice they get SIGTERM and the notice period."""
        names = self.runtime.running()
        self.host.mark_stopping(self.job.job_id, names)
        if notice_s > 0:
            self.runtime.stop(names, notice_s)
        else:
            self.runtime.kill(names)

    def close(self) -> None:
        self.runtime.close(self.job.stop_grace_s)


class InstanceLogs:
    """``run --log-dir DIR``: every line of every incarnation appended to its
    file, as the agents write them (runtime/logfiles.InstanceFiles). A write
    that fails (disk full) stops the files, never the job."""

    def __init__(self, directory: Path, on_error: Callable[[str], None],
                 limits: LogFileLimits = LogFileLimits()):
        self.directory = Path(directory)
        self.on_error = on_error
        self.limits = limits
        self.counters = LogFileCounters()
        self._files = InstanceFiles(self.directory, limits, self.counters)
        self.failed = False

    def write(self, line: LogLine) -> None:
        if self.failed:
            return
        try:
            self._files.write(line)
        except OSError as exc:
            self.failed = True
            self.on_error(f"instance log files stopped: {exc}")

    def flush(self) -> None:
        self._files.flush()

    def close_incarnation(self, instance: str, round_: int, start: int) -> None:
        """Its pipes are drained before its exit is reported: nothing more comes."""
        self._files.close_incarnation(None, instance, round_, start)

    def close(self) -> None:
        self._files.close()
        left_out = self.counters.log_lines_unwritten
        if left_out:
            self.on_error(f"{left_out} output lines were left out of the --log-dir files: they filled "
                          f"--log-file-max-mb x (--log-files-kept + 1) faster than rotated files may go "
                          f"(the run saw every line)")
