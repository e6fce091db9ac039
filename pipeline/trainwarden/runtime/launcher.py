"""Starts and stops one job's instances on this machine.

Knows the job definition (commands, environment) and turns "start worker-1 in
round 2" into a process with the right variables and a fresh SDK token.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from trainwarden.events import Event
from trainwarden.jobspec import JobDefinition, merged_env
from trainwarden.runtime.control import ControlServer, Incarnation
from trainwarden.runtime.environment import free_port, instance_env, sdk_import_dir
from trainwarden.runtime.local import LocalRuntime

MASTER_ADDR = "127.0.0.1"


class LocalJobRunner:
    def __init__(self, job: JobDefinition, sink: Callable[[Event], None], control: ControlServer, node: str,
                 run_dir: Path | None = None, line_sink: Callable[[Event, float], bool] | None = None):
        self.job = job
        self.control = control
        self.node = node
        self.runtime = LocalRuntime(job.job_id, sink, node, line_sink=line_sink)
        self._specs = {spec.name: spec for spec in job.instances()}
        self._run_dir = Path(run_dir or tempfile.mkdtemp(prefix=f"trainwarden-{job.job_id}-"))
        self._sdk_path = sdk_import_dir(self._run_dir)
        self._tokens: dict[str, str] = {}
        self._ports: dict[int, int] = {}

    @property
    def instance_names(self) -> list[str]:
        return list(self._specs)

    def tokens(self) -> dict[str, str]:
        """Instance -> token of its current incarnation (finds all its processes)."""
        return dict(self._tokens)

    def master_port(self, round_: int) -> int:
        # A free port per round: the previous round's port may linger in TIME_WAIT.
        if round_ not in self._ports:
            self._ports[round_] = free_port(MASTER_ADDR)
        return self._ports[round_]

    def start(self, name: str, round_: int, start: int) -> int:
        spec = self._specs[name]
        role = self.job.role(spec.role)
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
            extra=self._extra_env(role, round_, start),
        )
        return self.runtime.start(name, role.command, env, self.job.workdir, round_, start)

    def _extra_env(self, role, round_: int, start: int) -> dict:
        env = dict(merged_env(self.job, role))
        # Any incarnation after the first (restart, re-queued spot job) is a
        # resume: the job should load its latest checkpoint.
        env["TRAINWARDEN_RESUME"] = "1" if round_ > 0 or start > 0 else "0"
        if self.job.checkpoint_dir:
            env["TRAINWARDEN_CHECKPOINT_DIR"] = self.job.checkpoint_dir
        settings = self.job.settings
        if settings.enable_c4d_hang_detection:
            # C4D reads its thresholds from the environment of the processes it watches.
            env.update(settings.c4d_env())
        return env

    def _mark_stopping(self, names: Sequence[str]) -> None:
        for name in names:
            token = self._tokens.get(name)
            if token:
                self.control.mark_stopping(token)

    def stop(self, names: Sequence[str]) -> None:
        self._mark_stopping(names)
        self.runtime.stop(names, self.job.stop_grace_s)

    def stop_all(self) -> None:
        self._mark_stopping(list(self._tokens))
        self.runtime.stop_all(self.job.stop_grace_s)

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
