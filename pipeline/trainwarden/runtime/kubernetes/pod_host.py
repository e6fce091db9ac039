"""The process each pod's container runs: ``python -m trainwarden.runtime.kubernetes.pod_host``.

It runs the instance's incarnations one after the other, in place, as the
node's agent asks (node_side.PodHosts): a job restart is a new process in
the same pod, never a new pod. It listens on a Unix socket in its own
directory of the node's state directory (a hostPath, ``<state>/<pod
uid>/host.sock``, mode 0700), one JSON request a connection:

    {"run": {"instance", "round", "start", "command": [...], "env": {...}, "cwd": ""}}
        -> {"pid": N} (the pid in the pod)  |  {"refused": "why"}
    {"stop": {"grace_s": 10}} -> {"stopped": true}

For each incarnation ``r<round>s<start>``, it writes its output (stdout and
stderr, as a scheduler writes a task's) to ``.out``, then ``.start.json`` with its
pid, and ``.exit.json`` with its exit code (128+N for signal N) once it
ended: the agent adopts the process by the token in its environment (as
a scheduler's task is adopted) and ships the lines and the exit. With
``--preload MODULES``, each incarnation after the first is handed to a warm
standby interpreter kept in the pod (standby_pool.StandbyPool, streams
mode), as the agents do on their own nodes.

An incarnation the kernel kills at the container's memory limit (its OOM
kill count went up) gets a last line ``Reason: OOMKilled``: Kubernetes says
nothing of it, since the container itself lives on.

As the container's PID 1 it reaps every orphan, and it ends (stopping the
incarnation, SIGTERM then SIGKILL after the grace) when Kubernetes stops the
pod. It exits 0 then, so a deleted pod is no instance's failure.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from trainwarden.runtime.standby import python_invocation

PROG = "trainwarden-pod-host"
REQUEST_BYTES = 4 << 20  # a run's environment and command, with room
SOCKET = "host.sock"
MARK_VARIABLE = "TRAINWARDEN_POD_STANDBY"


def incarnation_stem(round_: int, start: int) -> str:
    return f"r{round_}s{start}"


def write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class PodHost:
    def __init__(self, directory: Path, preload: tuple[str, ...] = ()):
        self.directory = directory
        self.child: Optional[int] = None  # the running incarnation's pid (its process group)
        self.stem = ""
        self.exit_code: Optional[int] = None
        self.stopping = False
        self.oom_kills: Optional[int] = None  # the container's count when the incarnation started
        self.pool = None
        if preload:
            from trainwarden.runtime.standby_pool import StandbyPool

            self.pool = StandbyPool(preload, spawn_argv=lambda argv: argv, on_spawn=lambda pid: None,
                                    say=lambda text: print(f"{PROG}: --preload: {text}", file=sys.stderr, flush=True),
                                    streams=True)

    # ------------------------------------------------------------ requests

    def handle(self, request: dict) -> dict:
        if "run" in request and isinstance(request["run"], dict):
            return self.run(request["run"])
        if "stop" in request and isinstance(request["stop"], dict):
            grace = request["stop"].get("grace_s", 10)
            self.stop(float(grace) if isinstance(grace, (int, float)) else 10.0)
            return {"stopped": True}
        return {"refused": "a request is {\"run\": {...}} or {\"stop\": {...}}"}

    def run(self, run: dict) -> dict:
        command, env = run.get("command"), run.get("env", {})
        round_, start = run.get("round"), run.get("start")
        if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
            return {"refused": "'command' is not a list of strings"}
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            return {"refused": "'env' is not an object of strings"}
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (round_, start)):
            return {"refused": "'round' and 'start' must be whole numbers"}
        if self.child is not None:
            self.stop(10.0)  # the agent's stop was lost: never two incarnations at once
        stem = incarnation_stem(round_, start)
        cwd = run.get("cwd") or None
        child_env = {**os.environ, **env}
        out = os.open(self.directory / f"{stem}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            pid = self._hand_to_standby(command, child_env, cwd, out, stem) or self._spawn(command, child_env, cwd, out)
        except OSError as exc:
            os.write(out, f"{PROG}: cannot start {command[0]!r}: {exc.strerror or exc}\n".encode())
            write_json_atomic(self.directory / f"{stem}.start.json", {"pid": None, "started_at": time.time()})
            write_json_atomic(self.directory / f"{stem}.exit.json", {"exit_code": 127, "ended_at": time.time()})
            return {"pid": 0}
        finally:
            os.close(out)
        self.child, self.stem, self.exit_code, self.stopping = pid, stem, None, False
        self.oom_kills = oom_kills()
        write_json_atomic(self.directory / f"{stem}.start.json", {"pid": pid, "started_at": time.time()})
        return {"pid": pid}

    def _spawn(self, command: list, env: dict, cwd: Optional[str], out: int) -> int:
        pid = os.fork()
        if pid == 0:  # the child: its own process group, the output file as stdout and stderr
            try:
                os.setpgid(0, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                if cwd:
                    os.chdir(cwd)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                os.execvpe(command[0], command, env)
            except OSError as exc:
                os.write(2, f"{PROG}: cannot start {command[0]!r}: {exc.strerror or exc}\n".encode())
            os._exit(127)
        return pid

    def _hand_to_standby(self, command: list, env: dict, cwd: Optional[str], out: int, stem: str) -> int:
        if self.pool is None:
            return 0
        invocation, why = python_invocation(command)
        if invocation is None:
            self.pool.fresh(why)
            return 0
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            standby = self.pool.take(stem, invocation, env, cwd, MARK_VARIABLE, "pod-standby")
            if standby is None:
                return 0
            standby.hand_over(invocation, env, cwd, streams=(null, out, out))
        finally:
            os.close(null)
        return standby.popen.pid

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the incarnation's group, SIGKILL after the grace; its exit is written as it ends."""
        if self.child is None:
            return
        self.stopping = True
        _signal_group(self.child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.child is not None and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        if self.child is not None:
            _signal_group(self.child, signal.SIGKILL)
            while self.child is not None:
                self.reap()
                time.sleep(0.01)

    def reap(self) -> None:
        """Every ended child (PID 1 adopts the orphans); the incarnation's exit written."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == self.child:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                if code == 128 + signal.SIGKILL:
                    self._say_if_oom_killed()
                write_json_atomic(self.directory / f"{self.stem}.exit.json", {"exit_code": code, "ended_at": time.time()})
                self.child = None

    def _say_if_oom_killed(self) -> None:
        """A SIGKILL while the container's OOM kills went up: the kernel ended
        the incarnation at the container's memory limit. Kubernetes says
        nothing of it (the pod host, PID 1, lives on: the container does not
        end), so the incarnation's last line says it, as kubectl would."""
        before, after = self.oom_kills, oom_kills()
        if before is None or after is None or after <= before:
            return
        limit = memory_limit()
        said = f" of {limit // 2**20} MiB" if limit else ""
        line = (f"{PROG}: Reason: OOMKilled: the kernel's OOM killer ended this incarnation at its container's "
                f"memory limit{said} (resources.limits.memory)\n")
        try:
            fd = os.open(self.directory / f"{self.stem}.out", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


# The container's own memory cgroup, as runc mounts it (v1, then v2).
_OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
_LIMIT_FILES = ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max")


def oom_kills(files=_OOM_FILES) -> Optional[int]:
    """How many processes the kernel's OOM killer ended in this container; None where it does not say."""
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def memory_limit(files=_LIMIT_FILES) -> int:
    """The container's memory limit in bytes; 0 when it has none (or does not say)."""
    for path in files:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**62:  # v1's "no limit" is a huge number, v2's is "max"
            return int(text)
        return 0
    return 0


def _signal_group(pid: int, sig: int) -> None:
    if pid <= 0:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def serve(directory: Path, preload: tuple[str, ...], grace_s: float) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / SOCKET
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    host = PodHost(directory, preload)
    ending: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: ending.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: ending.append(signum))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    print(f"{PROG}: listening on {path}", flush=True)
    while not ending:
        for _key, _mask in selector.select(timeout=0.05):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5.0)
                try:
                    answer = host.handle(_request(conn))
                except (OSError, ValueError) as exc:
                    answer = {"refused": f"unreadable request: {exc}"[:300]}
                try:
                    conn.sendall((json.dumps(answer) + "\n").encode())
                except OSError:
                    pass
        host.reap()
    host.stop(grace_s)  # the pod is stopping: so is its incarnation
    host.close()
    return 0


def read_line(conn: socket.socket, limit: int = REQUEST_BYTES) -> bytes:
    """One JSON message: up to its newline or the end of the connection."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError(f"a message is at most {limit} bytes")
    return data


def _request(conn: socket.socket) -> dict:
    request = json.loads(read_line(conn) or b"null")
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="runs a Trainwarden instance's incarnations in its pod")
    parser.add_argument("--preload", default="", help="modules a warm standby imports before each incarnation")
    parser.add_argument("--grace", type=float, default=10.0, help="SIGTERM to SIGKILL when the pod stops")
    args = parser.parse_args(argv)
    uid, state = os.environ.get("TRAINWARDEN_POD_UID", ""), os.environ.get("TRAINWARDEN_POD_STATE", "")
    if not uid or not state:
        print(f"{PROG}: TRAINWARDEN_POD_UID and TRAINWARDEN_POD_STATE must be set (the pod's manifest sets them)",
              file=sys.stderr)
        return 2
    preload = tuple(m for m in args.preload.split(",") if m)
    return serve(Path(state) / uid, preload, args.grace)


if __name__ == "__main__":
    sys.exit(main())
