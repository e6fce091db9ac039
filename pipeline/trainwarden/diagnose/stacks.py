"""Python stack dumps as one model, whichever tool took them.

Parses the text of ``py-spy dump`` (and its ``--json``), ``pystack remote``
and Python's ``faulthandler`` into processes, threads and frames, innermost
frame first. Frames are normalised (function without its class, file without
its directory) so that the same place reads the same from every tool.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclasses.dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    name: str
    frames: tuple[Frame, ...]  # innermost first
    main: bool = False


@dataclasses.dataclass(frozen=True)
class ProcessDump:
    pid: int
    threads: tuple[ThreadStack, ...]
    tool: str
    instance: str = ""  # which instance the process belongs to, when known

    def main_thread(self) -> Optional[ThreadStack]:
        for thread in self.threads:
            if thread.main:
                return thread
        return self.threads[0] if self.threads else None


def frame(function: str, path: str, line: int) -> Frame:
    return Frame(function.rsplit(".", 1)[-1] if function != "<module>" else function,
                 path.replace("\\", "/").rsplit("/", 1)[-1], line)


# ------------------------------------------------------------------ py-spy

_PYSPY_PROCESS = re.compile(r"^Process (\d+):")
_PYSPY_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?')
_PYSPY_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)\s*$")


def parse_pyspy(text: str, default_pid: int = 0) -> list[ProcessDump]:
    processes: list[ProcessDump] = []
    pid = default_pid
    threads: list[ThreadStack] = []
    current: Optional[dict] = None

    def close_thread() -> None:
        nonlocal current
        if current is not None:
            threads.append(ThreadStack(current["id"], current["name"], tuple(current["frames"]),
                                       main=current["name"] == "MainThread"))
            current = None

    def close_process() -> None:
        nonlocal threads
        close_thread()
        if threads:
            processes.append(ProcessDump(pid, tuple(threads), "py-spy"))
        threads = []

    for line in text.splitlines():
        if match := _PYSPY_PROCESS.match(line):
            close_process()
            pid = int(match.group(1))
        elif match := _PYSPY_THREAD.match(line):
            close_thread()
            current = {"id": int(match.group(1), 0), "name": match.group(3) or "", "frames": []}
        elif current is not None and (match := _PYSPY_FRAME.match(line)):
            current["frames"].append(frame(match.group(1), match.group(2), int(match.group(3))))
    close_process()
    return processes


def parse_pyspy_json(text: str, pid: int) -> list[ProcessDump]:
    threads = []
    for item in json.loads(text):
        frames = tuple(frame(f.get("name", "?"), f.get("filename") or f.get("short_filename", "?"),
                             int(f.get("line") or 0)) for f in item.get("frames", []))
        name = item.get("thread_name") or ""
        threads.append(ThreadStack(int(item.get("os_thread_id") or item.get("thread_id") or 0), name, frames,
                                   main=name == "MainThread"))
    return [ProcessDump(int(pid), tuple(threads), "py-spy")] if threads else []


# ------------------------------------------------------------------ pystack

_PYSTACK_THREAD = re.compile(r"^Traceback for thread (\d+) \(([^)]*)\)(?: \[([^\]]*)\])?")
_PYSTACK_FRAME = re.compile(r'^\s+\((?:Python|C)\) File "(.+)", line (\d+), in (.+?)\s*$')


def parse_pystack(text: str, pid: int) -> list[ProcessDump]:
    threads = []
    current: Optional[dict] = None
    for line in text.splitlines():
        if match := _PYSTACK_THREAD.match(line):
            if current is not None:
                threads.append(current)
            current = {"id": int(match.group(1)), "name": (match.group(3) or "").strip(), "frames": []}
        elif current is not None and (match := _PYSTACK_FRAME.match(line)):
            current["frames"].append(frame(match.group(3), match.group(1), int(match.group(2))))
    if current is not None:
        threads.append(current)
    stacks = []
    for item in threads:
        # pystack prints the outermost frame first.
        frames = tuple(reversed(item["frames"]))
        main = item["id"] == pid or item["name"] == "MainThread"
        stacks.append(ThreadStack(item["id"], item["name"] or ("MainThread" if main else ""), frames, main=main))
    return [ProcessDump(pid, tuple(stacks), "pystack")] if stacks else []


# -------------------------------------------------------------- faulthandler

_FAULT_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FAULT_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+?)\s*$')


def parse_faulthandler(text: str, pid: int) -> list[ProcessDump]:
    threads: list[ThreadStack] = []
    current: Optional[dict] = None

    def close() -> None:
        if current is not None:
            threads.append(ThreadStack(current["id"], "MainThread" if current["main"] else "",
                                       tuple(current["frames"]), main=current["main"]))

    for line in text.splitlines():
        if match := _FAULT_THREAD.match(line):
            close()
            # faulthandler names no threads; the thread it was called from is
            # "Current thread", and a hung job is dumped from its main thread.
            current = {"id": int(match.group(2), 16), "main": match.group(1) == "Current thread", "frames": []}
        elif current is not None and (match := _FAULT_FRAME.match(line)):
            current["frames"].append(frame(match.group(3), match.group(1), int(match.group(2))))
    close()
    return [ProcessDump(pid, tuple(threads), "faulthandler")] if threads else []


def parse_any(text: str, pid: int = 0, hint: str = "") -> list[ProcessDump]:
    """Recognise the tool from the text (or the hint) and parse it."""
    stripped = text.lstrip()
    if hint == "py-spy-json" or stripped.startswith("["):
        try:
            return parse_pyspy_json(text, pid)
        except (ValueError, TypeError, AttributeError):
            pass
    if "Traceback for thread" in text:
        return parse_pystack(text, pid)
    if "(most recent call first):" in text:
        return parse_faulthandler(text, pid)
    return parse_pyspy(text, pid)


def split_concatenated(text: str) -> Iterable[str]:
    """Several dumps saved one after another: split at each tool's process header."""
    parts = re.split(r"(?m)^(?=Process \d+:)", text)
    return [p for p in parts if p.strip()]


def dumps_to_json(dumps: Iterable[ProcessDump]) -> str:
    """Dumps for the wire (agent -> actuator)."""
    return json.dumps([{"pid": d.pid, "instance": d.instance, "tool": d.tool,
                        "threads": [{"id": t.thread_id, "name": t.name, "main": t.main,
                                     "frames": [[f.function, f.file, f.line] for f in t.frames]}
                                    for t in d.threads]} for d in dumps])


def dumps_from_json(text: str) -> list[ProcessDump]:
    dumps = []
    for item in json.loads(text):
        threads = tuple(ThreadStack(int(t["id"]), str(t["name"]), tuple(Frame(str(f[0]), str(f[1]), int(f[2]))
                                                                          for f in t["frames"]), bool(t["main"]))
                        for t in item["threads"])
        dumps.append(ProcessDump(int(item["pid"]), threads, str(item["tool"]), str(item["instance"])))
    return dumps
