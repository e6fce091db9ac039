"""Starts and stops one job's instances on this machine.

Knows the job definition (commands, environment) and turns "start worker-1 in
round 2" into a process with the right variables, registered with the SDK
endpoint by its pid (its marker finds its processes for stack dumps).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S, DEFAULT_TOOLS, dump_instances
from trainwarden.events import Event, LogLine
from trainwarden.jobspec import JobDefinition
from trainwarden.runtime.base import Capability
from trainwarden.runtime.control import ControlServer, Incarnation
from trainwarden.runtime.environment import free_port, instance_env, job_env, sdk_import_dir
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.run_as import RunAs, share_sdk_path
from trainwarden.runtime.logfiles import LogFileCounters, LogFileLimits, RotatingLogFile

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
        self.stack_tools = tuple(stack_tools)
        self.stack_timeout_s = stack_timeout_s
        self.control = control
        self.node = node
        self.runtime = LocalRuntime(job.job_id, sink, node, line_sink=line_sink, preload=job.preload, say=say,
                                    run_as=run_as)
        self._specs = {spec.name: spec for spec in job.instances()}
        self._job_spec = job.spec()
        self._run_dir = Path(run_dir or tempfile.mkdtemp(prefix=f"trainwarden-{job.job_id}-"))
        self._sdk_path = sdk_import_dir(self._run_dir)
        if run_as is not None:
            share_sdk_path(self._sdk_path)
        self._tokens: dict[str, str] = {}
        self._ports: dict[int, int] = {}

    @property
    def instance_names(self) -> list[str]:
        return list(self._specs)

    def tokens(self) -> dict[str, str]:
        """Instance -> marker of its current incarnation (finds all its processes)."""
        return dict(self._tokens)

    def master_port(self, round_: int) -> int:
        # A free port per round: the previous round's port may linger in TIME_WAIT.
        if round_ not in self._ports:
            self._ports[round_] = free_port(MASTER_ADDR)
        return self._ports[round_]

    def start(self, name: str, round_: int, start: int) -> None:
        spec = self._specs[name]
        role = self._job_spec.role(spec.role)
        old = self._tokens.pop(name, None)
        if old:
            self.control.revoke(old)
        token = self.control.issue_token(Incarnation(self.job.job_id, name, round_, start))
        self._tokens[name] = token
        env = instance_env(
            base=os.environ, job_id=self.job.job_id, spec=spec, world_size=len(self._specs),
            round_=round_, start=start, max_restarts=self.job.settings.max_num_of_job_restart,
            master_addr=MASTER_ADDR, master_port=self.master_port(round_),
            control_address=self.control.address, token=token, sdk_path=self._sdk_path,
            extra=job_env(self._job_spec, role, self.job.settings), node=self.node,
        )
        pid = self.runtime.start(name, role.command, env, self.job.workdir, round_, start)
        self.control.bind(token, pid)

    def _mark_stopping(self, names: Sequence[str]) -> None:
        for name in names:
            token = self._tokens.get(name)
            if token:
                self.control.mark_stopping(token)

    def stop(self, names: Sequence[str], snapshot: str = "", incarnations=None) -> None:
        # One process runs the engine and these instances: what runs is what the decision was about.
        self._mark_stopping(names)
        self._dump(names, snapshot)
        self.runtime.stop(names, self.job.stop_grace_s)

    def stop_all(self, snapshot: str = "") -> None:
        self._mark_stopping(list(self._tokens))
        self._dump(list(self._tokens), snapshot)
        self.runtime.stop_all(self.job.stop_grace_s)

    def _dump(self, names: Sequence[str], snapshot: str) -> None:
        """The stacks of a hung job, taken before the stop ends it."""
        if not snapshot or self.reports is None:
            return
        self.reports.expect(snapshot, self.job.job_id, self.node)
        tokens = {name: token for name, token in self._tokens.items() if name in names}
        try:
            roots = {name: self.runtime.pid(name) for name in tokens}
            dumps, missing = dump_instances(tokens, self.stack_tools, self.stack_timeout_s, roots=roots) \
                if self.stack_tools else ([], ["no stack tool is configured"])
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis must not stop the restart
            dumps, missing = [], [f"{self.node}: stack dump failed: {exc!r}"]
        self.reports.hand_in(self.node, self.job.job_id, snapshot, dumps, missing)

    def preempt(self, notice_s: float) -> None:
        """The market took the instances back: without notice they die at
        once (SIGKILL); with notice they get SIGTERM and the notice period."""
        names = self.runtime.running()
        self._mark_stopping(names)
        if notice_s > 0:
            self.runtime.stop(names, notice_s)
        else:
            self.runtime.kill(names)

    def close(self) -> None:
        self.runtime.close(self.job.stop_grace_s)


def log_file(directory: Path, job_id: str, instance: str, round_: int, start: int, stream: str) -> Path:
    """Where an incarnation's output goes: the node agents' layout, so that the
    same Vector configuration and the same habits serve both."""
    return directory / job_id / instance / f"r{round_}-s{start}.{stream}.log"


class InstanceLogs:
    """``run --log-dir DIR``: every line of every incarnation appended to its
    file, as the agents write them, each file rotating at ``limits``
    (runtime/logfiles.py). A write that fails (disk full) stops the files,
    never the job."""

    def __init__(self, directory: Path, on_error: Callable[[str], None],
                 limits: LogFileLimits = LogFileLimits()):
        self.directory = Path(directory)
        self.on_error = on_error
        self.limits = limits
        self.counters = LogFileCounters()
        self._files: dict[tuple[str, int, int, str], RotatingLogFile] = {}
        self.failed = False

    def write(self, line: LogLine) -> None:
        if self.failed:
            return
        key = (line.instance, line.round, line.start, line.stream.value)
        try:
            handle = self._files.get(key)
            if handle is None:
                path = log_file(self.directory, line.job_id, *key)
                handle = self._files[key] = RotatingLogFile(path, self.limits, self.counters)
            handle.write_line(line.text)
        except OSError as exc:
            self.failed = True
            self.on_error(f"instance log files stopped: {exc}")

    def flush(self) -> None:
        for handle in self._files.values():
            try:
                handle.flush()
            except OSError:
                pass

    def close_incarnation(self, instance: str, round_: int, start: int) -> None:
        """Its pipes are drained before its exit is reported: nothing more comes."""
        for key in [k for k in self._files if k[:3] == (instance, round_, start)]:
            self._close(key)

    def close(self) -> None:
        for key in list(self._files):
            self._close(key)
        left_out = self.counters.log_lines_unwritten
        if left_out:
            self.on_error(f"{left_out} output lines were left out of the --log-dir files: they filled "
                          f"--log-file-max-mb x (--log-files-kept + 1) faster than rotated files may go "
                          f"(the run saw every line)")

    def _close(self, key) -> None:
        handle = self._files.pop(key)
        try:
            handle.close()
        except OSError:
            pass
