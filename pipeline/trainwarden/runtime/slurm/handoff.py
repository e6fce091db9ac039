"""What task.py and a node's standby host (standby_host.py) agree on: where
the host listens, the messages between them, and which part of a task's
environment decides which standbys can become its instance.

The host listens on a Unix socket in a directory only its user can enter,
on the node itself (``$TMPDIR``, per allocation run and node name: the
nodes of a development machine share one host). A task sends one message,
``{"run": {"instance", "command", "env", "cwd"}}``, with its own stdin,
stdout and stderr attached (``SCM_RIGHTS``); the host answers
``{"pid": P}`` once a standby has become the instance, or ``{"refused":
why}``, and later ``{"exit": code}`` (negative for a signal, as
``Popen.returncode``). Every message is one newline-ended JSON object of at
most ``MESSAGE_MAX`` bytes; either side treats anything else as the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import tempfile
from pathlib import Path
from typing import Optional, Sequence

MESSAGE_MAX = 4 << 20  # an instance's environment, command line and working directory
STREAMS = 3  # stdin, stdout, stderr
# The shell wrapper runtime.py puts around a job's command when it has a workdir.
WORKDIR_SCRIPT = 'cd "$0" && exec "$@"'
# Every task of a step carries every task's token (in task order) in the
# environment srun starts it with: what the agent reads from
# /proc/PID/environ to know which incarnation a standby became, or an
# instance that ended before the agent looked (adopt.py, proof.py).
TASK_TOKENS = "TRAINWARDEN_TASK_TOKENS"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes


class HandoffError(OSError):
    """The other side sent something that is not a message of this protocol."""


def in_workdir(workdir: str, command: Sequence[str]) -> list[str]:
    return ["/bin/sh", "-c", WORKDIR_SCRIPT, workdir, *command]


def unwrap_workdir(command: Sequence[str]) -> tuple[list[str], Optional[str]]:
    """(the job's own command, its workdir) of ``in_workdir``'s wrapper;
    (command, None) for any other command."""
    if len(command) >= 5 and list(command[:3]) == ["/bin/sh", "-c", WORKDIR_SCRIPT]:
        return list(command[4:]), command[3]
    return list(command), None


def shared_env(env: dict) -> dict:
    """The part of a task's environment that is the same in every round:
    without Slurm's per-step and per-task variables and the step's tokens,
    so that a standby prepared during one round suits the next one (the
    pool leaves the instance's own variables out itself)."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") and k != TASK_TOKENS}


def ready_name(slurm_job: int, restart: int, node: str) -> str:
    """The file in the job's shared directory that says a node's host listens (runtime.py waits for it)."""
    return f"{slurm_job}.r{restart}.{node}.ready"


def socket_root(uid: Optional[int] = None) -> Path:
    uid = os.getuid() if uid is None else uid
    return Path(tempfile.gettempdir()) / f"trainwarden-standby-{uid}"


def socket_path(root: Path, slurm_job: int, restart: int, node: str) -> Path:
    name = f"{slurm_job}.r{restart}.{node}.sock"
    path = Path(root) / name
    if len(str(path)) > _MAX_SOCKET_PATH or "/" in node or node in ("", ".", ".."):
        path = Path(root) / (hashlib.sha256(name.encode()).hexdigest()[:24] + ".sock")
    return path


def private_directory(root: Path, create: bool) -> Path:
    """``root``, a directory of this user that nobody else may enter
    (created 0700 if ``create``); OSError when it is anything else: another
    user may have made it to intercept the instances' streams."""
    root = Path(root)
    if create:
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{root} is not a directory of uid {os.getuid()} closed to everyone else")
    return root


def peer_uid(conn: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return uid


def send(conn: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = (json.dumps(message) + "\n").encode()
    if len(data) > MESSAGE_MAX:
        raise HandoffError(f"a message of {len(data)} bytes is over the {MESSAGE_MAX} bytes allowed")
    if fds:
        # The descriptors go with the first byte; the rest follows on the same stream.
        socket.send_fds(conn, [data[:1]], list(fds))
        data = data[1:]
    conn.sendall(data)


class Reader:
    """Messages from one connection, with the descriptors that came with them."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.buffer = b""
        self.fds: list[int] = []

    def message(self) -> Optional[dict]:
        """The next message; None at the end of the connection; HandoffError
        for anything that is not one (too long, not a JSON object)."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MESSAGE_MAX:
                raise HandoffError(f"a message over {MESSAGE_MAX} bytes")
            chunk, fds, _flags, _addr = socket.recv_fds(self.conn, 1 << 16, STREAMS + 1)
            self.fds.extend(fds)
            if len(self.fds) > STREAMS:
                raise HandoffError(f"{len(self.fds)} descriptors, more than the {STREAMS} streams")
            if not chunk:
                if self.buffer:
                    raise HandoffError("the connection ended inside a message")
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > MESSAGE_MAX:
            raise HandoffError(f"a message over {MESSAGE_MAX} bytes")
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise HandoffError(f"a message that is not JSON ({exc})") from None
        if not isinstance(message, dict):
            raise HandoffError("a message that is not a JSON object")
        return message

    def close_fds(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def run_request(message: dict) -> tuple[str, list[str], dict, str]:
    """(instance, command, env, cwd) of a task's ``run`` message; HandoffError when malformed."""
    body = message.get("run")
    if not isinstance(body, dict):
        raise HandoffError("no run request")
    instance, command, env, cwd = body.get("instance"), body.get("command"), body.get("env"), body.get("cwd")
    if not isinstance(instance, str) or not instance:
        raise HandoffError("the request names no instance")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise HandoffError("the request's command is not a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and "=" not in k and k
                                            for k, v in env.items()):
        raise HandoffError("the request's env is not an object of strings")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise HandoffError("the request's cwd is not an absolute path")
    if any("\0" in text for text in (instance, cwd, *command, *env, *env.values())):
        raise HandoffError("the request holds a NUL byte")
    return instance, list(command), dict(env), cwd
