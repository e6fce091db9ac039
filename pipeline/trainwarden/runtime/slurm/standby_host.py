"""A node's standby interpreters inside a job's Slurm allocation:
``python -m trainwarden.runtime.slurm.standby_host --ready-dir DIR --restart N MODULE ...``.

The slurm runtime starts one per node, as a long-lived step of the
allocation that overlaps the rounds' steps (``srun --overlap``: it holds no
CPU a round needs). It keeps a standby pool in streams mode
(runtime/standby_pool.py) and listens on a Unix socket of its own user
(handoff.py); each round's task wrapper (task.py) sends it its instance and
its stdin, stdout and stderr, and a standby that already imported the
job's ``preload`` modules becomes the instance. The host answers with the
standby's pid, then with its exit code; if the wrapper goes away first (it
was killed, its step cancelled), the host kills the instance's process
group.

Standbys are no instances: they write no manifests, and no agent adopts
one (adopt.py accepts a pid only for the wrapper whose streams it holds).
They live and die with the host: the parent-death signal, the keeper
(runtime/keeper.py) for what left their groups, and Slurm, which ends the
host's step with the allocation (a requeued allocation gets a new host).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

from trainwarden.runtime.keeper import MARK_VARIABLE
from trainwarden.runtime.keeper_lease import KeeperLease
from trainwarden.runtime.local import with_parent_death_signal, kill_incarnation
from trainwarden.runtime.slurm import handoff
from trainwarden.runtime.slurm.task import write_json_atomic
from trainwarden.runtime.standby import is_module_name, python_invocation
from trainwarden.runtime.standby_pool import StandbyPool
from trainwarden.runtime.stopping import signal_group

PROG = "trainwarden-standby-host"
REQUEST_S = 30.0  # a connected task has this long to send its request
BACKLOG = 64


class Host:
    def __init__(self, modules: Sequence[str], path: Path):
        self.path = Path(path)
        self.mark = os.urandom(8).hex()
        self._starts = itertools.count(1)
        self._said = ""
        self._lock = threading.Lock()
        self.running: dict[int, str] = {}  # standby pid -> its incarnation's mark
        self.counters = {"connections": 0, "refused": 0, "handed_over": 0, "dropped": 0}
        self._keeper = KeeperLease(self.mark)
        self.pool = StandbyPool(modules, spawn_argv=with_parent_death_signal, on_spawn=self._keeper.watch,
                                say=self._say, streams=True)
        try:
            self.path.unlink()  # a socket left by a host of this allocation run that was killed
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(BACKLOG)
        self.closing = False

    # ------------------------------------------------------------ serving

    def serve(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                if self.closing:
                    return
                continue
            threading.Thread(target=self._connection, args=(conn,), name="standby-handoff", daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        """One task's request: never raises (a bad peer must not end the host)."""
        self.counters["connections"] += 1
        reader = handoff.Reader(conn)
        try:
            if handoff.peer_uid(conn) != os.getuid():
                self.counters["refused"] += 1
                return  # not even an answer for another user
            conn.settimeout(REQUEST_S)
            message = reader.message()
            if message is None:
                return
            self._run(conn, reader, message)
        except (handoff.HandoffError, OSError, ValueError) as exc:
            self.counters["refused"] += 1
            _try_send(conn, {"refused": f"the standby host could not take the request ({exc})"})
        except Exception as exc:  # noqa: BLE001 - the host serves the other tasks whatever one did
            self.counters["refused"] += 1
            _say(f"a request failed: {exc!r}")
            _try_send(conn, {"refused": f"the standby host failed ({type(exc).__name__})"})
        finally:
            reader.close_fds()
            conn.close()

    def _run(self, conn: socket.socket, reader: handoff.Reader, message: dict) -> None:
        instance, command, env, cwd = handoff.run_request(message)
        if len(reader.fds) != handoff.STREAMS:
            raise handoff.HandoffError("the request did not bring its stdin, stdout and stderr")
        if not os.path.isabs(command[0]):
            raise handoff.HandoffError(f"the interpreter {command[0]!r} is not an absolute path")
        invocation, why = python_invocation(command)
        if invocation is None:
            self.counters["refused"] += 1
            handoff.send(conn, {"refused": why})
            return
        shared = handoff.shared_env(env)
        standby = self.pool.take(instance, invocation, shared, cwd, MARK_VARIABLE, f"{self.mark}-standby")
        if standby is None:
            self.counters["refused"] += 1
            handoff.send(conn, {"refused": f"no standby interpreter is available ({self._said or 'none started'})"})
            return
        mark = f"{self.mark}-{next(self._starts)}"
        pid = standby.popen.pid
        try:
            standby.hand_over(invocation, {**env, MARK_VARIABLE: mark}, cwd, streams=reader.fds)
        except OSError:
            signal_group(pid, signal.SIGKILL)
            standby.popen.wait()
            raise
        finally:
            reader.close_fds()  # the standby has its own copies now
        with self._lock:
            self.running[pid] = mark
        self.counters["handed_over"] += 1
        try:
            if not _try_send(conn, {"pid": pid}):
                signal_group(pid, signal.SIGKILL)  # the task is gone: nobody would report this instance
            code = self._wait(conn, standby.popen)
            _try_send(conn, {"exit": code})
        finally:
            # Orphans of its group, and descendants that left it: the task's step would have ended them.
            signal_group(pid, signal.SIGKILL)
            kill_incarnation(mark)
            self._keeper.forget(pid)
            if standby.popen.stderr is not None:
                standby.popen.stderr.close()
            with self._lock:
                self.running.pop(pid, None)

    def _wait(self, conn: socket.socket, popen) -> int:
        """The instance's exit code; its group is killed if the task's connection ends first."""
        pidfd = os.pidfd_open(popen.pid)
        # poll, not select: a host serving many tasks has descriptors past 1024.
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if pidfd in ready:
                    return popen.wait()
                try:
                    data = conn.recv(4096)  # a task says nothing more: only its end matters
                except OSError:
                    data = b""
                if not data:
                    self.counters["dropped"] += 1
                    signal_group(popen.pid, signal.SIGKILL)
                    poller.unregister(conn)
        finally:
            os.close(pidfd)

    # ------------------------------------------------------------ lifecycle

    def _say(self, text: str) -> None:
        self._said = text
        _say(text)

    def close(self) -> None:
        self.closing = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        try:
            self.path.unlink()
        except OSError:
            pass
        with self._lock:
            running = list(self.running)
        for pid in running:
            signal_group(pid, signal.SIGKILL)
        self.pool.close()
        self._keeper.close()
        _say("ended: " + json.dumps({**self.counters, **self.pool.counters}))


def sweep(root: Path) -> int:
    """Remove the sockets nobody listens on any more (a host the end of its
    allocation SIGKILLed could not remove its own); how many."""
    removed = 0
    for path in Path(root).glob("*.sock"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            try:
                path.unlink()
                removed += 1
            except OSError:
                pass
        except OSError:
            pass  # busy or odd: left alone
        finally:
            probe.close()
    return removed


def _try_send(conn: socket.socket, message: dict) -> bool:
    try:
        handoff.send(conn, message)
        return True
    except OSError:
        return False


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("--ready-dir", required=True, help="the job's shared directory the runtime watches")
    parser.add_argument("--restart", type=int, default=0, help="how often the allocation was requeued")
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args(argv)
    bad = [name for name in args.modules if not is_module_name(name)]
    node, job = os.environ.get("SLURMD_NODENAME", ""), os.environ.get("SLURM_JOB_ID", "")
    if bad or not node or not job.isdigit():
        _say(f"needs module names and to run as a task of a Slurm step (got modules {bad}, node {node!r}, "
             f"job {job!r}); the slurm runtime starts it with srun")
        return 2
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or args.restart)
    try:
        root = handoff.private_directory(handoff.socket_root(), create=True)
        sweep(root)
        host = Host(args.modules, handoff.socket_path(root, int(job), restart, node))
    except OSError as exc:
        _say(f"cannot listen for tasks: {exc}; the instances on node {node} start as ordinary processes")
        return 1
    def end(_signum: int, _frame: object) -> None:
        host.closing = True
        try:
            host.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)
    ready = Path(args.ready_dir) / handoff.ready_name(int(job), restart, node)
    try:
        Path(args.ready_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(ready, {"node": node, "pid": os.getpid(), "socket": str(host.path)})
    except OSError as exc:
        _say(f"cannot say it is ready in {args.ready_dir} ({exc.strerror or exc}); the runtime starts the round "
             "after its wait")
    _say(f"listening on {host.path} for job {job} on node {node} (preload {' '.join(args.modules)})")
    try:
        host.serve()
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
