"""Grouping stacks across every process of a hung job, and naming suspects.

Identical stacks (after normalisation) form a group. Groups with one member,
then the smaller ones, come first: in a job where most ranks wait in a
collective, the rank that is somewhere else is the likely culprit. Suspects
are decided on each instance's main thread: the instances outside the largest
group of main-thread stacks.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Iterable, Sequence

from trainwarden.diagnose.stacks import Frame, ProcessDump

MAX_FRAMES_SHOWN = 30


@dataclasses.dataclass(frozen=True)
class Member:
    instance: str
    pid: int
    thread: str

    def __str__(self) -> str:
        return f"{self.instance or '?'}/{self.pid}/{self.thread or 'thread'}"


@dataclasses.dataclass(frozen=True)
class StackGroup:
    frames: tuple[Frame, ...]
    members: tuple[Member, ...]
    main: bool  # the group holds main threads

    @property
    def count(self) -> int:
        return len(self.members)

    def top(self) -> str:
        return str(self.frames[0]) if self.frames else "(no Python frames)"


@dataclasses.dataclass(frozen=True)
class StackReport:
    groups: tuple[StackGroup, ...]
    suspects: tuple[str, ...]
    verdict: str
    processes: int
    tool: str
    missing: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({
            "verdict": self.verdict,
            "suspects": list(self.suspects),
            "processes": self.processes,
            "tool": self.tool,
            "missing": list(self.missing),
            "groups": [{"count": g.count, "main": g.main,
                        "threads": [str(m) for m in g.members],
                        "frames": [dataclasses.asdict(f) for f in g.frames[:MAX_FRAMES_SHOWN]]}
                       for g in self.groups],
        })

    def text(self) -> str:
        lines = [f"stack report: {self.verdict}",
                 f"  {self.processes} processes dumped with {self.tool or 'no tool'}, {len(self.groups)} distinct stacks"]
        for note in self.missing:
            lines.append(f"  missing: {note}")
        for group in self.groups:
            shown = ", ".join(str(m) for m in group.members[:6]) + (" ..." if group.count > 6 else "")
            lines.append(f"  [{group.count}] {shown}")
            for item in group.frames[:8]:
                lines.append(f"      {item}")
            if len(group.frames) > 8:
                lines.append(f"      ... {len(group.frames) - 8} more frames")
        return "\n".join(lines)


def build_report(dumps: Sequence[ProcessDump], missing: Iterable[str] = ()) -> StackReport:
    groups: dict[tuple, list[Member]] = collections.defaultdict(list)
    main_keys: set[tuple] = set()
    per_instance: dict[str, tuple] = {}
    for dump in dumps:
        main = dump.main_thread()
        for thread in dump.threads:
            key = thread.frames
            groups[key].append(Member(dump.instance, dump.pid, thread.name))
            if thread is main:
                main_keys.add(key)
                # An instance's own process is its lowest pid; children (data
                # loaders) come later and do not speak for the instance.
                if dump.instance and dump.instance not in per_instance:
                    per_instance[dump.instance] = key
    ordered = sorted(
        (StackGroup(key, tuple(members), key in main_keys) for key, members in groups.items()),
        key=lambda g: (g.count, not g.main, g.top()))
    suspects, verdict = _suspects(per_instance, groups)
    tools = sorted({d.tool for d in dumps})
    return StackReport(tuple(ordered), suspects, verdict, len(dumps), "+".join(tools), tuple(missing))


def _suspects(per_instance: dict[str, tuple], groups: dict[tuple, list[Member]]) -> tuple[tuple[str, ...], str]:
    if not per_instance:
        return (), "no instance could be dumped"
    by_stack: dict[tuple, list[str]] = collections.defaultdict(list)
    for instance, key in per_instance.items():
        by_stack[key].append(instance)
    ranked = sorted(by_stack.items(), key=lambda kv: -len(kv[1]))
    majority_key, majority = ranked[0]
    where = str(majority_key[0]) if majority_key else "(no Python frames)"
    if len(ranked) == 1:
        who = {1: "the only instance dumped is", 2: "both instances are"}.get(len(majority),
                                                                           f"all {len(majority)} instances are")
        return (), (f"{who} stuck at the same place, {where}: look at what they "
                    "wait for (a peer outside the job, storage, the network)")
    if len(majority) == len(ranked[1][1]):
        spread = sorted(per_instance)
        return tuple(spread), f"no majority: the {len(per_instance)} instances are stuck in {len(ranked)} places"
    suspects = tuple(sorted(i for key, names in ranked[1:] for i in names))
    elsewhere = "; ".join(f"{', '.join(sorted(names))} in {key[0] if key else '(no Python frames)'}"
                          for key, names in ranked[1:])
    others = "1 other waits" if len(majority) == 1 else f"{len(majority)} others wait"
    return suspects, (f"suspect {', '.join(suspects)}: {elsewhere}, while {others} in {where}")

