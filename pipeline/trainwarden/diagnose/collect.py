"""Taking the stack dumps: the only module here that runs anything.

Every process of an instance is found by its incarnation token in the
environment (so data-loader children and processes that left the group are
included), dumped with the first available tool of the configured order, in
parallel, each with its own timeout: one stuck dump cannot hold a restart
longer than that timeout.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from trainwarden.diagnose.report import StackReport, build_report
from trainwarden.diagnose.stacks import ProcessDump, parse_pystack, parse_pyspy, parse_pyspy_json

DEFAULT_TOOLS = ("py-spy", "pystack")
DEFAULT_TIMEOUT_S = 10.0


TOOL_ENV = {"py-spy": "TRAINWARDEN_PYSPY", "pystack": "TRAINWARDEN_PYSTACK"}


def find_tool(name: str) -> str | None:
    """$TRAINWARDEN_PYSPY / $TRAINWARDEN_PYSTACK, else the tool on PATH, else
    next to this Python (a virtualenv's bin)."""
    override = os.environ.get(TOOL_ENV.get(name, ""), "")
    if override:
        return override if os.access(override, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else None


def processes_of(token: str) -> list[int]:
    """Pids whose environment carries this incarnation's token, lowest first."""
    if not token:
        return []
    marker = f"TRAINWARDEN_TOKEN={token}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return sorted(pids)


def _run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, errors="replace")
    return proc.returncode, proc.stdout, proc.stderr


def dump_process(pid: int, tools: Sequence[str], timeout_s: float) -> tuple[ProcessDump | None, str]:
    """One process's stacks, or the reason there are none."""
    reasons = []
    for tool in tools:
        binary = find_tool(tool)
        if binary is None:
            reasons.append(f"{tool} is not installed")
            continue
        argv = [binary, "dump", "--pid", str(pid), "--json"] if tool == "py-spy" else [binary, "remote", str(pid)]
        try:
            code, out, err = _run(argv, timeout_s)
        except subprocess.TimeoutExpired:
            reasons.append(f"{tool} took longer than {timeout_s:g} s")
            continue
        except OSError as exc:
            reasons.append(f"{tool} could not run: {exc.strerror}")
            continue
        if code != 0:
            said = (err or out).strip().splitlines()
            reasons.append(f"{tool} failed: {said[-1] if said else f'exit code {code}'}")
            continue
        dumps = parse_pyspy_json(out, pid) if tool == "py-spy" else parse_pystack(out, pid)
        if not dumps and tool == "py-spy":
            dumps = parse_pyspy(out, pid)
        if dumps:
            return dumps[0], ""
        reasons.append(f"{tool} found no Python stack")
    return None, f"pid {pid}: " + "; ".join(reasons)


def snapshot(tokens: Mapping[str, str], tools: Sequence[str] = DEFAULT_TOOLS,
             timeout_s: float = DEFAULT_TIMEOUT_S, workers: int = 16) -> StackReport:
    """Dump every process of these instances (instance -> token) and group the stacks."""
    dumps, missing = dump_instances(tokens, tools, timeout_s, workers)
    return build_report(dumps, missing)


def dump_instances(tokens: Mapping[str, str], tools: Sequence[str] = DEFAULT_TOOLS,
                   timeout_s: float = DEFAULT_TIMEOUT_S, workers: int = 16,
                   roots: Optional[Mapping[str, int]] = None) -> tuple[list[ProcessDump], list[str]]:
    """The dumps of every process of these instances, and what could not be
    dumped. ``roots``: each instance's own process, which a standby that
    became the instance started without the token in its environment."""
    found = {instance: set(processes_of(token)) | ({roots[instance]} if roots and roots.get(instance) else set())
             for instance, token in tokens.items()}
    targets = [(instance, pid) for instance, pids in found.items() for pid in sorted(pids)]
    missing = [f"{instance}: no process found" for instance, pids in found.items() if not pids]
    dumps: list[ProcessDump] = []
    if targets:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(targets))) as pool:
            futures = {pool.submit(dump_process, pid, tools, timeout_s): (instance, pid)
                       for instance, pid in targets}
            for future in concurrent.futures.as_completed(futures):
                instance, pid = futures[future]
                dump, reason = future.result()
                if dump is None:
                    missing.append(f"{instance}: {reason}")
                else:
                    dumps.append(ProcessDump(dump.pid, dump.threads, dump.tool, instance))
    dumps.sort(key=lambda d: (d.instance, d.pid))
    return dumps, sorted(missing)


def tool_order(text: str | None) -> tuple[str, ...]:
    """``TRAINWARDEN_STACK_TOOLS=pystack,py-spy`` style order; unknown names are refused."""
    if not text:
        return DEFAULT_TOOLS
    order = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in order if t not in DEFAULT_TOOLS]
    if unknown or not order:
        raise ValueError(f"stack tools must be among {', '.join(DEFAULT_TOOLS)}, not {text!r}")
    return order


def configured() -> tuple[tuple[str, ...], float]:
    tools = tool_order(os.environ.get("TRAINWARDEN_STACK_TOOLS"))
    timeout = float(os.environ.get("TRAINWARDEN_STACK_TIMEOUT", DEFAULT_TIMEOUT_S))
    return tools, timeout
