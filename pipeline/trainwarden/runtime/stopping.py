"""Stopping incarnations on this machine: the stack dump first, then the
signals. Shared by the node host's own processes and the ones it adopted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from trainwarden.diagnose.collect import dump_instances

POLL_S = 0.05


def dump_stacks(tokens: Mapping[str, str], roots: Mapping[str, Optional[int]], tools: Sequence[str],
                timeout_s: float, node: str) -> tuple[list, list[str]]:
    """The stacks of these instances (name -> token; roots: name -> its own
    process) before they are stopped, and what could not be dumped. Never
    raises: a failed diagnosis must not keep the instances alive."""
    if not tools:
        return [], ["no stack tool is configured"]
    try:
        return dump_instances(tokens, tools, timeout_s, roots={n: p for n, p in roots.items() if p})
    except Exception as exc:  # noqa: BLE001 - a failed dump must not stop the restart
        return [], [f"{node}: stack dump failed: {exc!r}"]


def stop_process_groups(pids: Sequence[int], grace_s: float) -> None:
    """SIGTERM to each process's group, SIGKILL to what is left after the
    grace period (processes this machine did not start: no exit to wait on)."""
    pids = [pid for pid in pids if pid > 0]  # 0: an instance already gone when adopted
    for pid in pids:
        signal_tree(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(POLL_S)
    for pid in pids:
        if alive(pid):
            signal_tree(pid, signal.SIGKILL)


def signal_tree(pid: int, sig: int) -> None:
    """The process's group (its starter put it in one of its own), else the
    process: one this machine did not start, so not one it reaped."""
    if not signal_group(pid, sig):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> bool:
    """Only the group: its leader may be gone and its pid another process's
    by now (an incarnation this machine reaped). False when there is none."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
