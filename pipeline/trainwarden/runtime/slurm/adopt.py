"""A node agent's side of the ``slurm`` runtime: the tasks Slurm started on
this node become the agent's instances, adopted by its node host
(``runtime/adoption.py``: ``SlurmTasks`` is an ``Adopter``).

Slurm, not the agent, starts them (``runtime/slurm/task.py`` under srun);
the agent follows their manifests and output files (``files.TaskFiles``)
and turns them into the same events as its own instances: started, lines,
exited. An incarnation is only adopted when the actuator announced it
(``ExpectTasks``): the token in the task's environment must hash to one the
actuator issued for that job, so a process cannot pass itself off as
another job's instance by writing a manifest. The SDK endpoint then accepts
that token for that incarnation. A standby that became the instance
(standby_host.py) was executed before any token existed: its task wrapper's
token counts, once the kernel shows that the standby holds the wrapper's
own stdin, stdout and stderr (proof.py). An instance whose process is gone
before the agent looked (it ended at once, or never started) is vouched
for by its task wrapper, which waits for the agent's word before it exits
(``files.adopted_name``): a task's exit is never lost to the agent's pace.
A task is followed (its lines, its exit) only once adopted: one announced
late loses nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from trainwarden.clock import now as clock_now
from trainwarden.events import InstanceExited, InstanceStarted, LogLine, Stream
from trainwarden.runtime.adoption import Adopted, AdopterFactory, Announcements, executed_token, token_digest
from trainwarden.runtime.slurm.files import (
    ADOPTION_WAIT_S,
    TaskExited,
    TaskFiles,
    TaskKey,
    TaskLines,
    TaskStarted,
)
from trainwarden.runtime.slurm.proof import standby_token, wrapper_token
from trainwarden.runtime.stopping import alive, stop_process_groups

# token_digest: how runtime.py announces the tokens these tasks are proven by.
__all__ = ["UNANNOUNCED_S", "SlurmTasks", "adopter", "address_file", "token_digest"]

# A task can start before its announcement arrives (the bus and the
# manifest directory race); after this long it is not ours to follow.
UNANNOUNCED_S = ADOPTION_WAIT_S


def address_file(control_dir: Path, node: str) -> Path:
    """Where a node's agent says where its SDK endpoint listens (task.py reads it)."""
    return Path(control_dir) / f"{node}.address"


def adopter(directory: Path, node: str, clock: Callable[[], float] = clock_now) -> AdopterFactory:
    """The tasks Slurm starts on this node, for its agent's node host (``agent --slurm-dir``)."""
    return lambda control_address: SlurmTasks(directory, node, clock, control_address)


class SlurmTasks:
    def __init__(self, directory: Path, node: str, clock: Callable[[], float], control_address: str):
        self.directory = Path(directory)
        self.files = TaskFiles(self.directory / "manifests", node, output_dir=self.directory / "outputs")
        self.clock = clock
        self.node = node
        self.announced = Announcements()  # the incarnations the actuator issued tokens for
        self.adopted: dict[TaskKey, Adopted] = {}
        self._waiting: list[tuple[float, TaskStarted]] = []
        self.refused = 0
        path = address_file(self.directory / "control", node)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(control_address)
        tmp.replace(path)

    def expect(self, job_id: str, incarnations) -> None:
        self.announced.expect(job_id, incarnations)

    def poll(self) -> list:
        """For the node host: Adopted first, then InstanceStarted, LogLine
        and InstanceExited as its own instances would give them."""
        out: list = []
        now = self.clock()
        retry, self._waiting = self._waiting, []
        for since, started in retry:
            self._start(started, since, now, out)
        for started in self.files.starts():
            self._start(started, now, now, out)
        # Only adopted tasks are followed: a task waiting for its announcement keeps its lines and exit.
        for event in self.files.progress(follow=lambda key: key in self.adopted):
            adopted = self.adopted[event.key]
            inc = adopted.incarnation
            if isinstance(event, TaskLines):
                out.extend(LogLine(job_id=inc.job_id, time=now, instance=inc.instance, round=inc.round,
                                   start=inc.start, text=text, stream=Stream.STDOUT) for text in event.lines)
            elif isinstance(event, TaskExited):
                del self.adopted[event.key]
                out.append(InstanceExited(job_id=inc.job_id, time=now, instance=inc.instance, round=inc.round,
                                          start=inc.start, exit_code=event.shell_code))
        return out

    def _start(self, started: TaskStarted, since: float, now: float, out: list) -> None:
        token, pid = _token(started)
        incarnation = self.announced.incarnation(token)
        if incarnation is None or incarnation.instance != started.instance:
            if now - since < UNANNOUNCED_S and started.key not in self.adopted:
                self._waiting.append((since, started))
            else:
                self.refused += 1
                if started.key not in self.adopted:
                    self.files.forget(started.key)
            return
        adopted = self.adopted[started.key] = Adopted(incarnation, token, pid, started.key)
        self.files.mark_adopted(started.key)
        out.append(adopted)
        out.append(InstanceStarted(job_id=incarnation.job_id, time=now, instance=incarnation.instance,
                                   round=incarnation.round, start=incarnation.start, node=self.node, pid=pid))

    def claims(self, asked) -> bool:
        return False  # Slurm starts its tasks itself: the node host is never asked to

    def launch(self, launch) -> None:
        raise AssertionError("Slurm's tasks are started by srun, never launched by the node host")

    def stop(self, stopped, grace_s: float) -> None:
        """SIGTERM to each task's process group (task.py starts the command in
        a group of its own), SIGKILL to what is left after the grace period."""
        stop_process_groups([item.pid for item in stopped if item.pid], grace_s)


def _token(started: TaskStarted) -> tuple[Optional[str], int]:
    """The incarnation token that vouches for the manifest's pid, and the
    pid to follow: 0 when the instance's process is gone already (nothing
    to signal or dump; a pid reused since must never be)."""
    if started.pid:
        token = executed_token(started.pid)
        if token is None and started.task_pid is not None:
            token = standby_token(started.task_pid, started.pid)
        if token is not None:
            return token, started.pid
        if alive(started.pid):
            return None, started.pid  # a process that cannot prove itself
    if started.task_pid is None:
        return None, 0
    return wrapper_token(started.task_pid, started.job_id, started.step_id, started.task_id), 0
