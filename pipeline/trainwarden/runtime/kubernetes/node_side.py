"""A node's side of the ``kubernetes`` runtime: the pod hosts on this node
(pod_host.py) run the incarnations the agent hands them, and the agent
adopts what they start, as it adopts a batch scheduler's tasks.

The agent runs on the node with the host's PID namespace (the DaemonSet's
``hostPID``; in CI beside the kubelets). A pod host answers a run with the
pid in its pod; the agent adopts the process only when the kernel shows it:
a process whose cgroup is that pod's (its uid in ``/proc/PID/cgroup``) and
whose innermost namespace pid is the one answered (``NSpid`` in
``/proc/PID/status``), and, for a process executed for that incarnation,
whose environment holds the incarnation's token (a warm standby was
executed before the token existed: its cgroup and pid prove it). Then the
agent follows the incarnation's output file and exit manifest, which the
pod host writes in the node's state directory, and turns them into the same
events as its own instances: started, lines, exited.

Lines come through this adoption, not from the kubelet's CRI log files:
one container runs many incarnations in place, and a CRI file holds the
container's stream with no mark of which incarnation printed a line, is
rotated by the kubelet on its own schedule, and is readable only on the
node anyway. The pod host writes each incarnation's output to a file of its
own, so a line is never attributed to the wrong round.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import Callable, Optional

from trainwarden.events import InstanceExited, InstanceStarted, LogLine, Stream
from trainwarden.runtime.adoption import executed_token
from trainwarden.runtime.kubernetes.pod_host import SOCKET, incarnation_stem, read_line

# In a StartInstance's environment: the incarnation is for this pod's host, not a process of the agent's own.
POD_UID_VARIABLE = "TRAINWARDEN_POD_UID"
ANSWER_S = 5.0
LINE_MAX = 16_000  # characters of one line shipped; longer ones are cut
READ_MAX = 1 << 20  # bytes of one output file read per poll


class PodHostError(Exception):
    pass


@dataclasses.dataclass
class Followed:
    job_id: str
    instance: str
    round: int
    start: int
    uid: str
    pod_pid: int
    node: str = ""
    host_pid: int = 0
    offset: int = 0
    partial: bytes = b""
    started: bool = False


class PodHosts:
    def __init__(self, state_dir: Path, node: str, clock: Callable[[], float], proc: Path = Path("/proc"),
                 control_address: str = ""):
        """``control_address``: the node's SDK endpoint (a Unix socket the pods
        reach through a hostPath at the same path, KubeSite.agent_dir); each
        incarnation gets it as TRAINWARDEN_SDK_SOCKET. The endpoint tells the
        caller by its host pid (SO_PEERCRED crosses PID namespaces), which
        the adoption proved."""
        self.control_address = control_address
        self.state_dir = Path(state_dir)
        self.node = node
        self.clock = clock
        self.proc = proc
        self.followed: dict[tuple[str, str, int, int], Followed] = {}
        self.refused = 0

    def directory(self, uid: str) -> Path:
        return self.state_dir / uid

    def _ask(self, uid: str, request: dict, answer: bool = True) -> dict:
        path = self.directory(uid) / SOCKET
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(ANSWER_S)
            try:
                conn.connect(str(path))
                conn.sendall((json.dumps(request) + "\n").encode())
                if not answer:
                    return {}
                data = read_line(conn)
            except (OSError, ValueError) as exc:
                why = getattr(exc, "strerror", None) or exc
                raise PodHostError(f"the pod host of pod {uid} does not answer at {path}: {why}") from None
        try:
            answer = json.loads(data)
        except ValueError:
            raise PodHostError(f"the pod host of pod {uid} answered no JSON") from None
        return answer if isinstance(answer, dict) else {}

    def ready(self, uid: str) -> bool:
        return (self.directory(uid) / SOCKET).exists()

    def run(self, uid: str, job_id: str, instance: str, round_: int, start: int, command: list, env: dict,
            cwd: str = "", node: str = "") -> int:
        """Hand an incarnation to the pod's host; its pid in the pod (0: it could not start)."""
        handed = self.hand(uid, job_id, instance, round_, start, command, env, cwd, node)
        self.follow(handed)
        return handed.pod_pid

    def hand(self, uid: str, job_id: str, instance: str, round_: int, start: int, command: list, env: dict,
             cwd: str = "", node: str = "") -> Followed:
        """The pod's host starts the incarnation; what to follow of it, its
        host pid proven (not followed yet: ``follow``). Touches nothing of
        this object's state, so that a thread may wait on the pod host."""
        env = dict(env)
        if self.control_address:
            env["TRAINWARDEN_SDK_SOCKET"] = self.control_address
        answer = self._ask(uid, {"run": {"instance": instance, "round": round_, "start": start,
                                         "command": list(command), "env": env, "cwd": cwd}})
        pid = answer.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise PodHostError(f"the pod host of pod {uid} refused incarnation {round_}/{start} of {instance}: "
                               f"{str(answer.get('refused', answer))[:300]}")
        handed = Followed(job_id, instance, round_, start, uid, pid, node or self.node)
        self._adopt(handed, env.get("TRAINWARDEN_TOKEN", ""))
        return handed

    def follow(self, handed: Followed) -> None:
        """Its start, lines and exit come out of ``poll`` from now on."""
        self.followed[(handed.job_id, handed.instance, handed.round, handed.start)] = handed

    def stop(self, uid: str, grace_s: float) -> None:
        """Asked, not waited for: the pods of a round stop together, each
        within its grace; each exit arrives as the incarnation's exit file."""
        self._ask(uid, {"stop": {"grace_s": grace_s}}, answer=False)

    def host_pid(self, key: tuple[str, str, int, int]) -> int:
        followed = self.followed.get(key)
        return followed.host_pid if followed else 0

    # ------------------------------------------------------------ adoption

    def _adopt(self, followed: Followed, token: str) -> None:
        if followed.pod_pid <= 0:
            return
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if _innermost_pid(entry) != followed.pod_pid or not _in_pod(entry, followed.uid):
                continue
            own = executed_token(pid)
            if token and own is not None and own != token:
                self.refused += 1  # another incarnation's process with the same pod pid: never
                continue
            followed.host_pid = pid
            return

    def poll(self) -> list:
        """InstanceStarted, LogLine and InstanceExited of the incarnations handed out."""
        out: list = []
        now = self.clock()
        for key, followed in list(self.followed.items()):
            directory = self.directory(followed.uid)
            stem = incarnation_stem(followed.round, followed.start)
            if not followed.started and (directory / f"{stem}.start.json").exists():
                followed.started = True
                out.append(InstanceStarted(job_id=followed.job_id, time=now, instance=followed.instance,
                                           round=followed.round, start=followed.start, node=followed.node,
                                           pid=followed.host_pid))
            ended = _exit_code(directory / f"{stem}.exit.json")
            out.extend(self._lines(followed, directory / f"{stem}.out", now, flush=ended is not None))
            if ended is not None:
                del self.followed[key]
                out.append(InstanceExited(job_id=followed.job_id, time=now, instance=followed.instance,
                                          round=followed.round, start=followed.start, exit_code=ended))
        return out

    def _lines(self, followed: Followed, path: Path, now: float, flush: bool) -> list:
        try:
            with open(path, "rb") as f:
                f.seek(followed.offset)
                data = f.read(READ_MAX)
        except OSError:
            return []
        followed.offset += len(data)
        data = followed.partial + data
        lines = data.split(b"\n")
        followed.partial = lines.pop()
        if flush and followed.partial:
            lines.append(followed.partial)
            followed.partial = b""
        return [LogLine(job_id=followed.job_id, time=now, instance=followed.instance, round=followed.round,
                        start=followed.start, text=line.decode("utf-8", "replace")[:LINE_MAX], stream=Stream.STDOUT)
                for line in lines]


def _exit_code(path: Path) -> Optional[int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    code = data.get("exit_code") if isinstance(data, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _innermost_pid(entry: Path) -> int:
    try:
        for line in (entry / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _in_pod(entry: Path, uid: str) -> bool:
    try:
        cgroup = (entry / "cgroup").read_text()
    except OSError:
        return False
    return uid in cgroup or uid.replace("-", "_") in cgroup
