"""The agent side of task.py: its manifests and the tasks' output files, polled.

One TaskFiles per node agent: each poll() reads the start manifests it has
not seen (only those of its node), tails each task's output file from where
it left off (append mode: nothing is read twice; a requeued task starts at
the offset its start manifest recorded), and reports the task's exit once
its exit manifest exists and the output file is drained to its end. The
agent follows a task only once it has adopted it (adopt.py): until then its
output and exit wait in their files, so that a task adopted late (its
announcement came after its start) loses nothing; once adopted, the agent
says so to the task's wrapper by a marker beside its manifests, which the
wrapper waits for before it exits (task.py).

A manifest is written by the task, i.e. by the job's user: the output file it
names is read (as root) only where srun writes a task's output, under the
name srun gives it, never through a symbolic link, and only if it is a
regular file, so that a job cannot have a file it may not read shipped as
its own lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Optional, Union

TRUNCATED = " …[line truncated]"
_READ_CHUNK = 1 << 20
# A task not adopted this long after its start manifest appeared never will
# be (it was not announced: not ours to follow); its wrapper waits no longer.
ADOPTION_WAIT_S = 30.0


def adopted_name(stem: str) -> str:
    """The marker an agent leaves beside a task's manifests once it adopted the task."""
    return f"{stem}.adopted"


def output_name(job_id: int, step_id: int, task_id: int) -> str:
    """srun's ``%j-step%s-task%t.out`` (cli.STEP_OUTPUT) for one task."""
    return f"{job_id}-step{step_id}-task{task_id}.out"


@dataclasses.dataclass(frozen=True)
class TaskKey:
    job_id: int
    step_id: int
    task_id: int
    restart: int = 0


@dataclasses.dataclass(frozen=True)
class TaskStarted:
    job_id: int
    step_id: int
    task_id: int
    node: str
    instance: str
    pid: Optional[int]  # None: the command could not be started (an exit follows)
    output: str
    restart: int = 0
    # The task wrapper's own pid when ``pid`` is a standby that became the
    # instance (the token is checked on the wrapper: proof.py); else None.
    task_pid: Optional[int] = None

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.job_id, self.step_id, self.task_id, self.restart)


@dataclasses.dataclass(frozen=True)
class TaskLines:
    job_id: int
    step_id: int
    task_id: int
    instance: str
    lines: list[str]
    restart: int = 0

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.job_id, self.step_id, self.task_id, self.restart)


@dataclasses.dataclass(frozen=True)
class TaskExited:
    job_id: int
    step_id: int
    task_id: int
    instance: str
    exit_code: int  # the command's code; -N when signal N ended it
    restart: int = 0

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.job_id, self.step_id, self.task_id, self.restart)

    @property
    def shell_code(self) -> int:
        """128 + N for signal N, as a shell reports it."""
        return 128 - self.exit_code if self.exit_code < 0 else self.exit_code


TaskEvent = Union[TaskStarted, TaskLines, TaskExited]


@dataclasses.dataclass
class _Tail:
    started: TaskStarted
    path: Path
    stem: str
    offset: int
    partial: bytearray = dataclasses.field(default_factory=bytearray)
    skipping: bool = False  # inside a line already reported truncated


def _int(data: dict[str, Any], key: str, default: Optional[int] = None) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(key)
    return value


class TaskFiles:
    """Follows the tasks task.py runs on ``node``, from its manifests in manifest_dir."""

    def __init__(self, manifest_dir: Path, node: str, *, max_line_bytes: int = 16384,
                 output_dir: Optional[Path] = None):
        """output_dir: where srun writes the tasks' output; a manifest naming
        a file elsewhere is refused (None: the manifest's own directory's
        sibling is not checked, for tests of one directory)."""
        self.manifest_dir = Path(manifest_dir)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.node = node
        self.max_line_bytes = max_line_bytes
        self.rejected = 0  # manifests that could not be read or lacked fields
        self._seen: set[str] = set()  # start manifests handled (ours, others', rejected)
        self._bad_exit: set[str] = set()
        self._tails: dict[TaskKey, _Tail] = {}

    @property
    def running(self) -> list[TaskKey]:
        """Tasks started whose exit has not been reported yet."""
        return list(self._tails)

    def poll(self, follow: Optional[Callable[[TaskKey], bool]] = None) -> list[TaskEvent]:
        """New tasks, then the lines and exits of the tasks ``follow`` accepts (all without it)."""
        return [*self.starts(), *self.progress(follow)]

    def starts(self) -> list[TaskStarted]:
        """The tasks of this node whose start manifest appeared since the last call."""
        events: list[TaskStarted] = []
        for path in sorted(self.manifest_dir.glob("*.start.json")):
            if path.name in self._seen:
                continue
            self._seen.add(path.name)
            read = self._read_start(path)
            if read is None or read[0].node != self.node:
                continue
            started, offset = read
            stem = path.name[: -len(".start.json")]
            self._tails[started.key] = _Tail(started, Path(started.output), stem, offset)
            events.append(started)
        return events

    def progress(self, follow: Optional[Callable[[TaskKey], bool]] = None) -> list[TaskEvent]:
        """New lines and exits of the tasks ``follow`` accepts; the others' wait in their files."""
        events: list[TaskEvent] = []
        for key, tail in list(self._tails.items()):
            if follow is not None and not follow(key):
                continue
            # Exit first, then read: whatever the command wrote is in the file by then.
            exit_code = self._read_exit(tail)
            lines = self._read_lines(tail, final=exit_code is not None)
            s = tail.started
            if lines:
                events.append(TaskLines(s.job_id, s.step_id, s.task_id, s.instance, lines, s.restart))
            if exit_code is not None:
                events.append(TaskExited(s.job_id, s.step_id, s.task_id, s.instance, exit_code, s.restart))
                del self._tails[key]
        return events

    def forget(self, key: TaskKey) -> None:
        """A task not to follow (never adopted): its files are left alone from now on."""
        self._tails.pop(key, None)

    def mark_adopted(self, key: TaskKey) -> None:
        """Tell the task's wrapper that its agent follows it: it need not wait any longer."""
        tail = self._tails.get(key)
        if tail is None:
            return
        try:
            (self.manifest_dir / adopted_name(tail.stem)).touch()
        except OSError:
            pass  # the wrapper waits ADOPTION_WAIT_S at most

    # ------------------------------------------------------------ manifests

    def _load(self, path: Path) -> Optional[dict[str, Any]]:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _read_start(self, path: Path) -> Optional[tuple[TaskStarted, int]]:
        """The manifest's TaskStarted and the output offset it recorded."""
        data = self._load(path)
        try:
            if data is None:
                raise ValueError("unreadable")
            pid, task_pid = data.get("pid"), data.get("task_pid")
            for value in (pid, task_pid):
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ValueError("pid")
            node, instance, output = data.get("node"), data.get("instance"), data.get("output")
            if not all(isinstance(v, str) and v for v in (node, instance, output)):
                raise ValueError("node/instance/output")
            job_id, step_id, task_id = _int(data, "job_id"), _int(data, "step_id"), _int(data, "task_id")
            named = Path(output)
            if named.name != output_name(job_id, step_id, task_id) or (
                    self.output_dir is not None and os.path.realpath(named.parent) != os.path.realpath(self.output_dir)):
                raise ValueError("output")  # not the file srun writes for this task
            started = TaskStarted(
                job_id=job_id,
                step_id=step_id,
                task_id=task_id,
                node=node,
                instance=instance,
                pid=pid,
                output=output,
                restart=_int(data, "restart", 0),
                task_pid=task_pid,
            )
            offset = max(0, _int(data, "output_offset", 0))
        except ValueError:
            self.rejected += 1
            return None
        return started, offset

    def _read_exit(self, tail: _Tail) -> Optional[int]:
        path = self.manifest_dir / f"{tail.stem}.exit.json"
        if path.name in self._bad_exit or not path.exists():
            return None
        data = self._load(path)
        try:
            if data is None:
                raise ValueError("unreadable")
            return _int(data, "exit_code")
        except ValueError:
            self._bad_exit.add(path.name)
            self.rejected += 1
            return None

    # ------------------------------------------------------------ output

    def _read_lines(self, tail: _Tail, *, final: bool) -> list[str]:
        data = bytearray()
        try:
            fd = os.open(tail.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError("not a regular file")
            with os.fdopen(fd, "rb") as f:
                f.seek(tail.offset)
                while True:
                    chunk = f.read(_READ_CHUNK)
                    if not chunk:
                        break
                    data += chunk
                    if not final and len(data) >= 8 * _READ_CHUNK:
                        break  # the rest next poll
        except OSError:
            pass
        tail.offset += len(data)
        lines: list[str] = []
        buf = tail.partial + data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            self._emit(tail, bytes(buf[start:nl]), lines)
            tail.skipping = False
            start = nl + 1
        rest = buf[start:]
        if final:
            if rest:
                self._emit(tail, bytes(rest), lines)
            rest = bytearray()
            tail.skipping = False
        elif len(rest) > self.max_line_bytes:
            self._emit(tail, bytes(rest), lines)
            tail.skipping = True  # drop the rest of this line up to its newline
            rest = bytearray()
        tail.partial = bytearray(rest)
        return lines

    def _emit(self, tail: _Tail, raw: bytes, lines: list[str]) -> None:
        if tail.skipping:
            return
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if len(raw) > self.max_line_bytes:
            text = _cut_utf8(raw, self.max_line_bytes).decode("utf-8", errors="replace") + TRUNCATED
        else:
            text = raw.decode("utf-8", errors="replace")
        lines.append(text)


def _cut_utf8(raw: bytes, limit: int) -> bytes:
    """raw[:limit] without a UTF-8 sequence that the cut broke in two."""
    cut = raw[:limit]
    i = len(cut)
    while i > 0 and len(cut) - i < 3 and (cut[i - 1] & 0xC0) == 0x80:
        i -= 1
    if i > 0 and cut[i - 1] >= 0xC0:
        need = 2 if cut[i - 1] < 0xE0 else 3 if cut[i - 1] < 0xF0 else 4
        if len(cut) - (i - 1) < need:
            return cut[: i - 1]
    return cut
