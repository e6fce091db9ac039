"""The per-task wrapper srun starts: ``python -m trainwarden.runtime.slurm.task PLAN.json``.

The plan (JSON, written by the caller)::

    {"instances": [{"name": "worker-0", "command": ["python", "train.py"], "env": {}}, ...],
     "master_addr": null, "master_port": 29500,
     "manifest_dir": "/shared/manifests", "output_dir": "/shared/out"}

Task ``SLURM_PROCID == i`` runs instance i with os.environ + the instance's
env + torchrun's variables (parse.torch_env_from_slurm; master_addr null:
the NodeAddr of the step's first node, from ``scontrol show node``, else its
name). An instance restarted alone is the one task of a step of its own;
its ``as_task`` (parse.round_task_env) holds the Slurm variables it had in
the round's step, which replace the step's own in its environment and in
what torchrun's variables are derived from (manifests and output keep the
real step's ids). Before the command starts it writes the start manifest
``<job>.<step>.<task>.start.json`` (``...<task>.r<N>.start.json`` after the
job's Nth requeue, since step ids start at 0 again), and when the command has
ended the exit manifest ``....exit.json``; both atomically, with this
wrapper's own pid as ``task_pid``. The command runs
in its own process group with this process's stdout/stderr (srun's per-task
file); SIGTERM, SIGINT and SIGHUP are forwarded to that group. The wrapper
exits with the command's code, 128+N when signal N ended it; 2 on a bad plan,
127 when the command cannot be started.

When the plan says the job preloads (``"standby": true``), a Python command
is handed to a standby interpreter of the node's standby host instead
(standby_host.py, handoff.py): the wrapper sends its instance and its own
stdin, stdout and stderr, writes the standby's pid in the start manifest
(with its own as ``task_pid``: the agent checks the token on the wrapper,
proof.py), forwards signals to the standby's group and waits for the exit
code the host reports. Without a host, or whenever the hand-over fails, the
command starts as an ordinary process, and the wrapper says once why.

A wrapper srun started with the step's tokens (``handoff.TASK_TOKENS``: a
node agent adopts the task, adopt.py) is what proves the task to the agent
when the instance's own process is gone before the agent looked (proof.py):
once the command has ended, it waits until the agent has adopted the task
(the marker ``files.adopted_name``), at most ``files.ADOPTION_WAIT_S``,
before it exits. A command that ends at once is thus never lost to the
agent's pace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from trainwarden.runtime.slurm import handoff
from trainwarden.runtime.slurm.files import ADOPTION_WAIT_S, adopted_name, output_name
from trainwarden.runtime.slurm.parse import expand_hostlist, parse_nodes, torch_env_from_slurm
from trainwarden.runtime.slurm.proof import can_prove
from trainwarden.runtime.standby import python_invocation

PROG = "trainwarden-slurm-task"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
BAD_PLAN = 2
CANNOT_START = 127
HOST_ANSWER_S = 30.0  # a host never waits for imports: it answers at once, or is stuck
ADOPTED_POLL_S = 0.05  # how often a wrapper whose command ended looks for its agent's marker


class PlanError(ValueError):
    pass


def manifest_stem(job_id: int, step_id: int, task_id: int, restart: int = 0) -> str:
    """``12.0.1`` (``12.0.1.r2`` after the second requeue): the manifests' common name."""
    stem = f"{job_id}.{step_id}.{task_id}"
    return f"{stem}.r{restart}" if restart else stem


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _int_var(environ: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    value = environ.get(name, "").strip()
    if not value:
        if default is not None:
            return default
        raise PlanError(f"{name} is not set (not started by srun?)")
    if not value.isdigit():
        raise PlanError(f"{name}={value!r} is not a number")
    return int(value)


def load_plan(path: str, environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plan, this task's instance); PlanError when either is unusable."""
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise PlanError(f"{path} is not JSON: {e}") from e
    if not isinstance(plan, dict):
        raise PlanError(f"{path} holds no JSON object")
    instances = plan.get("instances")
    if not isinstance(instances, list) or not instances:
        raise PlanError(f"{path} has no instances list")
    for key in ("manifest_dir", "output_dir"):
        if not isinstance(plan.get(key), str) or not plan[key]:
            raise PlanError(f"{path} has no {key}")
    if not isinstance(plan.get("master_port", 29500), int):
        raise PlanError(f"{path}: master_port is not a number")
    if plan.get("master_addr") is not None and not isinstance(plan["master_addr"], str):
        raise PlanError(f"{path}: master_addr is neither null nor a string")
    procid = _int_var(environ, "SLURM_PROCID")
    if procid >= len(instances):
        raise PlanError(f"{path} has {len(instances)} instances but this is task {procid}")
    inst = instances[procid]
    if not isinstance(inst, dict) or not isinstance(inst.get("name"), str):
        raise PlanError(f"{path}: instance {procid} has no name")
    cmd = inst.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise PlanError(f"{path}: instance {procid} has no command (a list of strings)")
    env = inst.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise PlanError(f"{path}: instance {procid} env is not an object of strings")
    as_task = inst.get("as_task", {})
    if not isinstance(as_task, dict) or not all(isinstance(k, str) and k.startswith("SLURM_") and isinstance(v, str)
                                                for k, v in as_task.items()):
        raise PlanError(f"{path}: instance {procid} as_task is not an object of SLURM_* strings")
    return plan, inst


def first_node_addr(environ: Mapping[str, str]) -> str:
    """NodeAddr of the step's first node (``scontrol show node``), else its name, else this host's name."""
    nodes = expand_hostlist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST"))
    if not nodes:
        return socket.gethostname()
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", nodes[0]],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        for node in parse_nodes(out.stdout):
            if node.name == nodes[0] and node.addr:
                return node.addr
    except (OSError, subprocess.SubprocessError):
        pass
    return nodes[0]


class Standby:
    """The standby that became this task's instance, on the host's connection."""

    def __init__(self, conn: socket.socket, reader: handoff.Reader, pid: int):
        self.conn = conn
        self.reader = reader
        self.pid = pid

    def wait(self) -> int:
        """Its exit code as the host reports it (negative for a signal). If
        the host goes away first, the instance is killed: nothing would
        report it otherwise."""
        try:
            self.conn.settimeout(None)
            message = self.reader.message()
        except (OSError, handoff.HandoffError):
            message = None
        code = message.get("exit") if message else None
        if not isinstance(code, int) or isinstance(code, bool):
            print(f"{PROG}: the node's standby host ended before the instance; the instance was killed",
                  file=sys.stderr, flush=True)
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            code = -signal.SIGKILL
        self.reader.close_fds()
        self.conn.close()
        return code


def _program(command: list[str], env: Mapping[str, str], cwd: str) -> Optional[list[str]]:
    """The command with its program found as exec would find it; None when it is not found."""
    program = command[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        return [path, *command[1:]] if os.access(path, os.X_OK) and not os.path.isdir(path) else None
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    return [found, *command[1:]] if found else None


def hand_to_standby(inst: Mapping[str, Any], env: dict, job_id: int, restart: int,
                    node: str) -> tuple[Optional[Standby], str]:
    """(the standby that became the instance, "") or (None, why not)."""
    command, workdir = handoff.unwrap_workdir(inst["command"])
    cwd = os.path.abspath(workdir) if workdir else os.getcwd()
    if workdir and not os.path.isdir(cwd):
        return None, f"the workdir {workdir} is not a directory here"
    resolved = _program(command, env, cwd)
    if resolved is None:
        return None, f"{command[0]} is not found or not executable"
    invocation, why = python_invocation(resolved)
    if invocation is None:
        return None, why
    if not can_prove():
        return None, "this kernel cannot show the agent which standby became the instance (no kcmp)"
    path = handoff.socket_path(handoff.socket_root(), job_id, restart, node)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(HOST_ANSWER_S)
    reader = handoff.Reader(conn)
    try:
        handoff.private_directory(path.parent, create=False)
        conn.connect(str(path))
        if handoff.peer_uid(conn) != os.getuid():
            raise PermissionError(f"{path} is served by another user")
        sys.stdout.flush()
        sys.stderr.flush()
        handoff.send(conn, {"run": {"instance": inst["name"], "command": resolved, "env": env, "cwd": cwd}},
                     fds=(0, 1, 2))
        answer = reader.message()
    except FileNotFoundError:
        conn.close()
        return None, f"no standby host listens on node {node}"
    except (OSError, handoff.HandoffError) as e:
        conn.close()  # if a standby took the instance meanwhile, the host kills it now
        return None, f"the node's standby host did not answer ({getattr(e, 'strerror', None) or e})"
    pid = answer.get("pid") if answer else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        conn.close()
        refused = answer.get("refused") if answer else None
        return None, str(refused)[:300] if refused else "the node's standby host ended the connection"
    return Standby(conn, reader, pid), ""


def wait_for_agent(manifest_dir: Path, stem: str, environ: Mapping[str, str]) -> None:
    """Once the command has ended: stay until this task's agent has adopted
    it (at most ADOPTION_WAIT_S), when srun gave this wrapper the tokens an
    agent proves the task by. Past the command's end, only this process can."""
    if handoff.TASK_TOKENS not in environ:
        return  # no agent adopts this task
    marker = manifest_dir / adopted_name(stem)
    deadline = time.monotonic() + ADOPTION_WAIT_S
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(ADOPTED_POLL_S)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    environ = dict(os.environ)
    if len(argv) != 1:
        print(f"{PROG}: usage: python -m trainwarden.runtime.slurm.task PLAN.json", file=sys.stderr)
        return BAD_PLAN
    try:
        plan, inst = load_plan(argv[0], environ)
        job_id = _int_var(environ, "SLURM_JOB_ID")
        step_id = _int_var(environ, "SLURM_STEP_ID", _int_var(environ, "SLURM_STEPID", 0))
        task_id = _int_var(environ, "SLURM_PROCID")
        # A step srun starts from outside the batch script does not get
        # SLURM_RESTART_COUNT: the plan says how often the job was requeued,
        # or a requeued job's step 0 would overwrite the first run's manifests.
        restart = _int_var(environ, "SLURM_RESTART_COUNT", int(plan.get("restart", 0)))
        # An instance restarted alone runs as task 0 of a step of its own; it
        # keeps the Slurm variables (hence rank, world, master) it had in the round's step.
        as_task = inst.get("as_task", {})
        task_environ = {**environ, **as_task}
        master_addr = plan.get("master_addr") or first_node_addr(task_environ)
        torch_env = torch_env_from_slurm(task_environ, master_addr, int(plan.get("master_port", 29500)))
    except (PlanError, ValueError) as e:
        print(f"{PROG}: bad plan or environment: {e}", file=sys.stderr)
        return BAD_PLAN

    manifest_dir = Path(plan["manifest_dir"])
    output = Path(plan["output_dir"]) / output_name(job_id, step_id, task_id)
    stem = manifest_stem(job_id, step_id, task_id, restart)
    child_env = {**task_environ, **inst.get("env", {}), **torch_env}
    child_env.pop(handoff.TASK_TOKENS, None)  # the agent's, to know this task (proof.py): no instance's business
    node = environ.get("SLURMD_NODENAME", "")
    child_env["TRAINWARDEN_NODE"] = node
    if plan.get("control_dir"):
        # The SDK endpoint of this node's agent, which adopts the task (adopt.py).
        try:
            child_env["TRAINWARDEN_SDK_SOCKET"] = (Path(plan["control_dir"]) / f"{node}.address").read_text().strip()
        except OSError:
            print(f"{PROG}: no Trainwarden agent has said where it listens on node {node!r}; "
                  "the job's SDK calls will not reach it", file=sys.stderr)
    base = {
        "job_id": job_id,
        "step_id": step_id,
        "task_id": task_id,
        "restart": restart,
        "node": environ.get("SLURMD_NODENAME", ""),
        "instance": inst["name"],
        "output": str(output),
        "task_pid": os.getpid(),  # what vouches for the instance once its process is gone (proof.py)
    }
    try:
        manifest_dir.mkdir(parents=True, exist_ok=True)
        offset = output.stat().st_size if output.exists() else 0
    except OSError as e:
        print(f"{PROG}: cannot use manifest_dir {manifest_dir}: {e.strerror or e}", file=sys.stderr)
        return BAD_PLAN

    target: list[int] = []  # the instance's process group, once it exists
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not target:
            pending.append(signum)
            return
        try:
            os.killpg(target[0], signum)
        except (ProcessLookupError, PermissionError):
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)

    if plan.get("standby"):
        standby, why = hand_to_standby(inst, child_env, job_id, restart, node)
        if standby is not None:
            target.append(standby.pid)
            write_json_atomic(manifest_dir / f"{stem}.start.json", {
                **base, "pid": standby.pid, "output_offset": offset, "started_at": time.time()})
            for signum in pending:
                forward(signum, None)
            code = standby.wait()
            write_json_atomic(manifest_dir / f"{stem}.exit.json", {**base, "exit_code": code, "ended_at": time.time()})
            wait_for_agent(manifest_dir, stem, environ)
            return 128 - code if code < 0 else code
        print(f"{PROG}: --preload: {why}; this instance starts as an ordinary process", file=sys.stderr, flush=True)

    sys.stdout.flush()
    child: Optional[subprocess.Popen[bytes]] = None
    try:
        child = subprocess.Popen(inst["command"], env=child_env, preexec_fn=os.setpgrp)  # own process group
    except OSError as e:
        print(f"{PROG}: cannot start {inst['command'][0]!r}: {e.strerror or e}", file=sys.stderr)
        sys.stderr.flush()
        write_json_atomic(manifest_dir / f"{stem}.start.json", {**base, "pid": None, "output_offset": offset, "started_at": time.time()})
        write_json_atomic(manifest_dir / f"{stem}.exit.json", {**base, "exit_code": CANNOT_START, "ended_at": time.time()})
        wait_for_agent(manifest_dir, stem, environ)
        return CANNOT_START
    target.append(child.pid)
    write_json_atomic(
        manifest_dir / f"{stem}.start.json", {**base, "pid": child.pid, "output_offset": offset, "started_at": time.time()}
    )
    for signum in pending:
        forward(signum, None)
    code = child.wait()
    write_json_atomic(manifest_dir / f"{stem}.exit.json", {**base, "exit_code": code, "ended_at": time.time()})
    wait_for_agent(manifest_dir, stem, environ)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
