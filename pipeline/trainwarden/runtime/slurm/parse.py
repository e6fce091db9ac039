"""Pure parsers of what the Slurm CLI prints (no subprocess, no clock).

``scontrol show job|node|step -o`` prints one record per line as
``Key=value`` pairs separated by spaces, but some values hold spaces too
(``OS=Linux 6.1 #1 SMP``, ``Reason=Trainwarden isolated: nccl error
[root@2026-12-01T12:30:22]``). A new pair starts at a token that looks like a
Slurm key (an uppercase letter, then letters, digits, ``_``, ``/`` or ``:``,
then ``=``); anything else continues the previous value. A node's Reason
runs up to its ``[user@time]`` stamp, so even ``Key=value`` text inside a
reason stays in the reason.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Mapping, Optional, Sequence, Union

_KEY = re.compile(r"(?:^|(?<= ))([A-Z][A-Za-z0-9_]*(?:[/:][A-Za-z0-9_]+)*)=")
_REASON_STAMP = re.compile(r"\[[^\s\[\]@]+@[^\s\[\]]+\]")
_NULL = ("", "(null)", "None", "N/A")


def parse_kv(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record as a dict (values keep their spaces)."""
    text = line.strip()
    keys = list(_KEY.finditer(text))
    node = text.startswith("NodeName=")
    out: dict[str, str] = {}
    i = 0
    while i < len(keys):
        m = keys[i]
        key, start = m.group(1), m.end()
        if node and key == "Reason":
            stamp = _REASON_STAMP.search(text, start)
            if stamp is not None:
                out[key] = text[start : stamp.end()]
                while i < len(keys) and keys[i].start() < stamp.end():
                    i += 1
                continue
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        out[key] = text[start:end].strip()
        i += 1
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """Every non-empty line of ``scontrol show ... -o`` output."""
    return [parse_kv(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- hostlists


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_one(item: str) -> list[str]:
    open_ = item.find("[")
    if open_ < 0:
        return [item]
    close = item.find("]", open_)
    if close < 0:
        raise ValueError(f"hostlist {item!r} has an unclosed '['")
    prefix, body, rest = item[:open_], item[open_ + 1 : close], item[close + 1 :]
    numbers: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"hostlist {item!r} has a bad range {part!r}")
            width = len(lo) if lo.startswith("0") else 0
            numbers.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
        elif part.isdigit():
            numbers.append(part)
        else:
            raise ValueError(f"hostlist {item!r} has a bad element {part!r}")
    tails = _expand_one(rest)
    return [prefix + n + t for n in numbers for t in tails]


def expand_hostlist(text: Optional[str]) -> tuple[str, ...]:
    """``n[1-3,5]`` -> n1 n2 n3 n5; ``gpu-[01-03]`` keeps the zero padding.

    Empty, ``(null)`` and ``None`` give ``()``; a malformed list raises ValueError.
    """
    if text is None or text.strip() in _NULL:
        return ()
    out: list[str] = []
    for item in _split_top(text.strip()):
        out.extend(_expand_one(item))
    return tuple(out)


def compress_hostlist(names: "tuple[str, ...] | list[str]") -> str:
    """The reverse of expand_hostlist for names ending in a number: n1 n2 n3 n5 -> n[1-3,5]."""
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int]] = []
    plain: list[str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m is None:
            plain.append(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (m.group(1), width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    items = list(plain)
    for prefix, width in order:
        nums = sorted(set(groups[(prefix, width)]))
        ranges, lo, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:  # type: ignore[list-item]
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(str(lo).zfill(width) if lo == prev else f"{str(lo).zfill(width)}-{str(prev).zfill(width)}")
            if n is not None:
                lo = prev = n
        if len(nums) == 1:
            items.append(prefix + ranges[0])
        else:
            items.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(items)


def parse_tasks_per_node(text: str) -> tuple[int, ...]:
    """``2(x3),1`` -> (2, 2, 2, 1): tasks on each node of a step, in node order."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if m is None:
            raise ValueError(f"bad tasks-per-node element {part!r} in {text!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)


# ---------------------------------------------------------------- states


class NodeState(enum.Enum):
    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    MIXED = "MIXED"
    COMPLETING = "COMPLETING"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    DOWN = "DOWN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


class JobState(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        """The job (or step) will not run again by itself."""
        return self in _FINISHED_JOB


_FINISHED_JOB = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
        JobState.SPECIAL_EXIT,
    }
)

# sinfo's short (%t) and long (%T) names, lower case.
_NODE_WORDS = {
    "idle": NodeState.IDLE,
    "alloc": NodeState.ALLOCATED,
    "allocated": NodeState.ALLOCATED,
    "mix": NodeState.MIXED,
    "mixed": NodeState.MIXED,
    "comp": NodeState.COMPLETING,
    "completing": NodeState.COMPLETING,
    "drng": NodeState.DRAINING,
    "draining": NodeState.DRAINING,
    "drain": NodeState.DRAINED,
    "drained": NodeState.DRAINED,
    "down": NodeState.DOWN,
    "fail": NodeState.FAIL,
    "failg": NodeState.FAIL,
    "failing": NodeState.FAIL,
    "unk": NodeState.UNKNOWN,
    "unknown": NodeState.UNKNOWN,
    "future": NodeState.UNKNOWN,
    "futr": NodeState.UNKNOWN,
}
_BUSY = (NodeState.ALLOCATED, NodeState.MIXED, NodeState.COMPLETING)


def parse_node_state(text: str) -> tuple[NodeState, bool, bool]:
    """``State=`` of scontrol (``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``) or sinfo (``down*``, ``drng``).

    Returns (state, drain, not_responding). A drain flag on a busy node is
    DRAINING, on an idle one DRAINED; DOWN and FAIL stay what they are (with
    ``drain`` set), since the node is gone whatever the drain.
    """
    raw = text.strip()
    if not raw:
        return NodeState.UNKNOWN, False, False
    if raw.islower() or raw[-1:] in "*~#!%$@^-":
        not_responding = raw.endswith("*")
        word = raw.rstrip("*~#!%$@^-").lower()
        state = _NODE_WORDS.get(word, NodeState.UNKNOWN)
        return state, state in (NodeState.DRAINED, NodeState.DRAINING), not_responding
    base, *flags = raw.upper().split("+")
    not_responding = "NOT_RESPONDING" in flags or base.endswith("*")
    base = base.rstrip("*")
    try:
        state = NodeState(base)
    except ValueError:
        state = _NODE_WORDS.get(base.lower(), NodeState.UNKNOWN)
    drain = "DRAIN" in flags or state in (NodeState.DRAINED, NodeState.DRAINING)
    if "FAIL" in flags and state not in (NodeState.DOWN,):
        state = NodeState.FAIL
    elif drain and state in _BUSY:
        state = NodeState.DRAINING
    elif drain and state in (NodeState.IDLE, NodeState.UNKNOWN):
        state = NodeState.DRAINED
    return state, drain, not_responding


def parse_job_state(text: str) -> JobState:
    """``JobState=`` / squeue ``%T`` (``RUNNING``, ``CANCELLED by 0``) as a JobState."""
    word = text.strip().split(" ", 1)[0].split("+", 1)[0].upper()
    try:
        return JobState(word)
    except ValueError:
        return JobState.UNKNOWN


# ---------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class SlurmNode:
    name: str
    state: NodeState
    drain: bool
    not_responding: bool
    reason: str  # without Slurm's " [user@time]" stamp; "" when none
    addr: str = ""  # NodeAddr

    @property
    def usable(self) -> bool:
        """Up, responding and taking new work."""
        return not (self.drain or self.not_responding) and self.state in (
            NodeState.IDLE,
            NodeState.ALLOCATED,
            NodeState.MIXED,
        )


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: JobState
    nodes: tuple[str, ...]
    restarts: int
    reason: str
    excluded: tuple[str, ...]
    exit_code: Optional[int]  # None until finished; -N when killed by signal N
    batch_host: str = ""


StepId = Union[int, str]  # 0, 1, ... or "batch", "extern", "interactive"


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    job_id: int
    step_id: StepId
    state: JobState
    nodes: tuple[str, ...]

    @property
    def special(self) -> bool:
        """The batch, extern or interactive step (not one that srun launched)."""
        return isinstance(self.step_id, str)


def _value(record: Mapping[str, str], key: str) -> str:
    value = record.get(key, "")
    return "" if value in _NULL else value


def strip_reason_stamp(reason: str) -> str:
    """``nccl error [root@2026-12-01T12:30:22]`` -> ``nccl error``."""
    m = _REASON_STAMP.search(reason)
    if m is not None and m.end() == len(reason.rstrip()):
        return reason[: m.start()].rstrip()
    return reason.strip()


def node_from_record(record: Mapping[str, str]) -> SlurmNode:
    state, drain, not_responding = parse_node_state(record.get("State", ""))
    return SlurmNode(
        name=record["NodeName"],
        state=state,
        drain=drain,
        not_responding=not_responding,
        reason=strip_reason_stamp(_value(record, "Reason")),
        addr=_value(record, "NodeAddr"),
    )


def parse_exit_code(text: str) -> Optional[int]:
    """``ExitCode=2:0`` -> 2; ``0:9`` (killed by signal 9) -> -9."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if m is None:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return -sig if sig and not code else code


def job_from_record(record: Mapping[str, str]) -> SlurmJob:
    state = parse_job_state(record.get("JobState", ""))
    restarts = record.get("Restarts", "0")
    return SlurmJob(
        job_id=int(record["JobId"]),
        name=_value(record, "JobName"),
        state=state,
        nodes=expand_hostlist(_value(record, "NodeList")),
        restarts=int(restarts) if restarts.isdigit() else 0,
        reason=_value(record, "Reason"),
        excluded=expand_hostlist(_value(record, "ExcNodeList")),
        exit_code=parse_exit_code(record.get("ExitCode", "")) if state.finished else None,
        batch_host=_value(record, "BatchHost"),
    )


def parse_step_id(text: str) -> tuple[int, StepId]:
    """``1.batch`` -> (1, "batch"); ``12.3`` -> (12, 3)."""
    job, _, step = text.strip().partition(".")
    if not job.isdigit() or not step:
        raise ValueError(f"bad step id {text!r}")
    return int(job), int(step) if step.isdigit() else step


def step_from_record(record: Mapping[str, str]) -> SlurmStep:
    job_id, step_id = parse_step_id(record["StepId"])
    return SlurmStep(
        job_id=job_id,
        step_id=step_id,
        state=parse_job_state(record.get("State", "")),
        nodes=expand_hostlist(_value(record, "NodeList")),
    )


def parse_nodes(text: str) -> list[SlurmNode]:
    return [node_from_record(r) for r in parse_records(text) if "NodeName" in r]


def parse_jobs(text: str) -> list[SlurmJob]:
    return [job_from_record(r) for r in parse_records(text) if "JobId" in r]


def parse_steps(text: str) -> list[SlurmStep]:
    return [step_from_record(r) for r in parse_records(text) if "StepId" in r]


# ---------------------------------------------------------------- torchrun


def _int_env(environ: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            if not value.lstrip("-").isdigit():
                raise ValueError(f"{name}={value!r} is not a number")
            return int(value)
    raise ValueError(f"{' or '.join(names)} is not set: not inside a Slurm step")


def torch_env_from_slurm(
    environ: Mapping[str, str], master_addr: Optional[str], master_port: int
) -> dict[str, str]:
    """torchrun's variables from a Slurm task's (srun sets SLURM_PROCID and friends).

    master_addr None: the first node of the step's node list (a Slurm node
    name; callers that know its NodeAddr should pass that instead).
    Raises ValueError when a needed SLURM_* variable is missing or malformed.
    """
    rank = _int_env(environ, "SLURM_PROCID")
    world = _int_env(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    local_rank = _int_env(environ, "SLURM_LOCALID")
    node_rank = _int_env(environ, "SLURM_NODEID")
    per_node_text = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
    per_node = parse_tasks_per_node(per_node_text) if per_node_text else ()
    if node_rank < len(per_node):
        local_world = per_node[node_rank]
    elif len(per_node) == 1:
        local_world = per_node[0]
    else:
        raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={per_node_text!r} has no entry for node {node_rank}")
    if master_addr is None:
        nodes = expand_hostlist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST"))
        if not nodes:
            raise ValueError("no MASTER_ADDR given and SLURM_STEP_NODELIST is not set")
        master_addr = nodes[0]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    nnodes = environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES")
    if nnodes and nnodes.isdigit():
        env["GROUP_WORLD_SIZE"] = nnodes
    return env


def round_task_env(index: int, nodes: Sequence[str]) -> dict[str, str]:
    """The Slurm variables task ``index`` has in a round's step (one task per
    node on ``nodes``, in node order): what an instance restarted alone, in a
    step of its own, is given instead of that step's, so that its rank, world
    and master (torch_env_from_slurm) are the ones it had in the round."""
    if not nodes or not 0 <= index < len(nodes):
        raise ValueError(f"task {index} is not one of a step on {len(nodes)} nodes")
    count = str(len(nodes))
    per_node = f"1(x{count})" if len(nodes) > 1 else "1"
    hostlist = compress_hostlist(list(nodes))
    return {
        "SLURM_PROCID": str(index),
        "SLURM_NODEID": str(index),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": count,
        "SLURM_STEP_NUM_TASKS": count,
        "SLURM_NNODES": count,
        "SLURM_STEP_NUM_NODES": count,
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_NODELIST": hostlist,
        "SLURM_STEP_NODELIST": hostlist,
    }
