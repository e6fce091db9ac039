"""``trainwarden classify``: the verdict the engine would reach for a
failure, from one or several instances' logs (trainwarden/attribution.py)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional

from trainwarden.attribution import Failure, Judged, Judgement, judge
from trainwarden.cli.output import out_console, print_json
from trainwarden.rules.loader import load_rules
from trainwarden.simulation.outlook import ARGS, outlook
from trainwarden.yamlsrc import ConfigError

MAX_LOG_BYTES = 64 * 1024 * 1024
MAX_FILES = 10_000
_EXIT_HEADER = re.compile(r"^# exit_code:\s*(-?\d+)")
_COLOURS = {"retryable": "green", "not_retryable": "red", "unknown": "yellow"}


def _read(name: str) -> list[str]:
    if name == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES)
    else:
        try:
            with open(name, "rb") as handle:
                handle.seek(0, 2)
                size = handle.tell()
                handle.seek(max(0, size - MAX_LOG_BYTES))
                data = handle.read()
        except OSError as exc:
            raise ConfigError(f"cannot read the log: {exc.strerror}", name) from None
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _expand(files: list[str]) -> list[str]:
    """Directories stand for the files directly in them, in name order."""
    expanded: list[str] = []
    for name in files:
        path = Path(name)
        if name != "-" and path.is_dir():
            inside = sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not inside:
                raise ConfigError("the directory holds no log files", name)
            expanded.extend(inside)
        else:
            expanded.append(name)
    if len(expanded) > MAX_FILES:
        raise ConfigError(f"{len(expanded)} files is more than {MAX_FILES}", files[0])
    return expanded


def _instance_name(name: str, index: int, names: set[str]) -> str:
    base = "worker-0" if name == "-" else Path(name).stem or f"instance-{index}"
    candidate, n = base, 1
    while candidate in names:
        n += 1
        candidate = f"{base}-{n}"
    names.add(candidate)
    return candidate


def failures_from(files: list[str], codes: Optional[list[int]]) -> list[Failure]:
    files = _expand(files)
    if codes is not None and len(codes) not in (1, len(files)):
        raise ConfigError(f"{len(codes)} --exit-code values for {len(files)} files",
                          hint="give --exit-code once for every file, or once per file in order")
    failures, names = [], set()
    for index, name in enumerate(files):
        lines = _read(name)
        header = _EXIT_HEADER.match(lines[0]) if lines else None
        if codes is not None:
            code = codes[0] if len(codes) == 1 else codes[index]
        else:
            code = int(header.group(1)) if header else 1
        # Files given in the order the instances failed: the first is the earliest.
        failures.append(Failure(_instance_name(name, index, names), code, tuple(lines), float(index)))
    return failures


def _judged_json(judged: Judged, explain: bool) -> dict:
    verdict = judged.verdict
    entry = {"instance": judged.instance, "rank": judged.rank, "exit_code": judged.exit_code,
             "verdict": verdict.verdict.value, "category": verdict.category, "rule": verdict.rule,
             "consequence": judged.consequence, "message": verdict.message}
    if explain:
        entry["exception"] = verdict.exception
        entry["raised_in"] = verdict.raised_in
        entry["signal"] = verdict.signal
        entry["evidence"] = [{"rule": c.rule, "category": c.category, "verdict": c.verdict.value,
                              "priority": c.priority, "kind": c.kind, "line": c.line} for c in verdict.evidence]
    return entry


def as_json(judgement: Judgement, explain: bool) -> dict:
    root, verdict = judgement.root, judgement.verdict
    return {
        "verdict": verdict.verdict.value,
        "retryable": verdict.retryable,
        "category": verdict.category,
        "rule": verdict.rule,
        "exit_code": root.exit_code,
        "matched_line": verdict.matched_line,
        "message": verdict.message,
        "signature": verdict.signature,
        "root_cause": _judged_json(root, explain),
        "root_reason": judgement.reason.value,
        "consequences": [_judged_json(j, explain) for j in judgement.consequences],
    }


def _print(judgement: Judgement, explain: bool) -> None:
    root, verdict = judgement.root, judgement.verdict
    colour = _COLOURS[verdict.verdict.value]
    if verdict.kind == "none":
        # Nothing weighed at all: say so, rather than "unknown: unknown" and a
        # progress line passed off as the error.
        what = ("exit code 0 is a success: nothing to judge" if root.exit_code == 0 else
                f"no line names an error, and exit code {root.exit_code} alone does not say whether a restart "
                "would help")
        out_console.print(f"[{colour}]unknown[/]: {what} (rule {verdict.rule})")
        if verdict.message:
            out_console.print(f"  last line: {verdict.message}", markup=False)
    else:
        out_console.print(f"[{colour}]{verdict.verdict.value.replace('_', ' ')}[/]: {verdict.category} "
                          f"(rule {verdict.rule})")
    if verdict.matched_line:
        out_console.print(f"  matched: {verdict.matched_line}", markup=False)
    elif verdict.message and verdict.kind != "none":
        out_console.print(f"  last error: {verdict.message}", markup=False)
    out_console.print(f"  signature: {verdict.signature}", markup=False)
    if judgement.consequences or root.rank is not None:
        out_console.print(f"  root cause: {root.label} (exit code {root.exit_code}; "
                          f"{judgement.reason.value.replace('_', ' ')})", markup=False)
        for other in judgement.consequences:
            kind = "consequence" if other.consequence else "later failure"
            out_console.print(f"  {kind}: {other.label}: {other.verdict.category} ({other.verdict.rule})",
                              markup=False)
    if explain:
        out_console.print("evidence weighed (winner first; own error > aftermath > exception type > exit code, "
                          "then priority):")
        for judged in (root, *judgement.consequences):
            v = judged.verdict
            where = f" raised in {v.raised_in}" if v.raised_in else ""
            out_console.print(f"  {judged.label}: exit {judged.exit_code}"
                              + (f", signal {v.signal}" if v.signal else "")
                              + (f", exception {v.exception}{where}" if v.exception else ""), markup=False)
            if not v.evidence:
                out_console.print("    (no classifier matched: the fallback verdict)", markup=False)
            for c in v.evidence:
                line = f": {c.line[:160]}" if c.line else ""
                out_console.print(f"    {c.rule} [{c.kind}, priority {c.priority}] {c.verdict.value} "
                                  f"{c.category}{line}", markup=False)


def _operational(pack, judgement: Judgement, keywords: tuple[str, ...]) -> tuple[str, list]:
    root = judgement.root
    return outlook(pack, root.exit_code, root.lines, keywords)


def _print_operational(phase: str, outcomes: list) -> None:
    out_console.print(f"operational evidence a running job adds (engine/operational.py; --args \"{ARGS}\"):",
                      markup=False)
    out_console.print(f"  phase the lines show: {phase}", markup=False)
    for outcome in outcomes:
        out_console.print(f"  {outcome.words}: {outcome.summary()}", markup=False)
    weighed = next((d.evidence for o in reversed(outcomes) for d in o.decisions if d.evidence), "")
    if weighed:
        out_console.print(f"  e.g. {weighed}", markup=False)


def cmd_classify(args: argparse.Namespace) -> int:
    pack = load_rules(args.rules)
    keywords = tuple(args.keyword)
    judgement = judge(pack, failures_from(args.files, args.exit_code), keywords)
    if args.json:
        result = as_json(judgement, args.explain)
        if args.explain:
            phase, outcomes = _operational(pack, judgement, keywords)
            result["operational"] = {"phase": phase, "situations": {
                o.situation: [{"action": d.kind.value, "reason": d.reason.value, "rule": d.rule,
                               "evidence": d.evidence} for d in o.decisions] for o in outcomes}}
        print_json(result)
    else:
        _print(judgement, args.explain)
        if args.explain:
            _print_operational(*_operational(pack, judgement, keywords))
    return 0
