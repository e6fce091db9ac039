"""``trainwarden classify``, ``rules validate`` and ``rules test``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from trainwarden.classify import classify
from trainwarden.cli.output import err_console, out_console, print_json, table
from trainwarden.rules.loader import load_rules, rule_files, shipped_rules_dir
from trainwarden.rules.testing import run_files
from trainwarden.yamlsrc import ConfigError

MAX_LOG_BYTES = 64 * 1024 * 1024


def _read_log(name: str) -> list[str]:
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


def cmd_classify(args: argparse.Namespace) -> int:
    pack = load_rules(args.rules)
    verdict = classify(pack, args.exit_code, _read_log(args.file), args.keyword)
    result = dataclasses.asdict(verdict)
    result["exit_code"] = args.exit_code
    if args.json:
        print_json(result)
        return 0
    colour = "green" if verdict.retryable else "red"
    out_console.print(f"[{colour}]{'retryable' if verdict.retryable else 'not retryable'}[/]: "
                      f"{verdict.category} (rule {verdict.rule})")
    if verdict.matched_line:
        out_console.print(f"  matched: {verdict.matched_line}", markup=False)
    elif verdict.message:
        out_console.print(f"  last error: {verdict.message}", markup=False)
    out_console.print(f"  signature: {verdict.signature}", markup=False)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    directory = Path(args.directory) if args.directory else shipped_rules_dir()
    pack = load_rules(directory)
    rows = ([("classifier", c.name, f"{c.category}, {'retryable' if c.retryable else 'not retryable'}, "
              f"priority {c.priority}", str(c.origin)) for c in pack.classifiers]
            + [("response", r.name, f"{r.action.value} ({r.reason.value})", str(r.origin)) for r in pack.responses]
            + [("limit", lim.name, f"{lim.kind.value} -> fail_job ({lim.reason.value})", str(lim.origin))
               for lim in pack.limits]
            + [("detector", d.name, f"{d.kind.value} -> {d.action.value}", str(d.origin)) for d in pack.detectors])
    if args.json:
        print_json({"valid": True, "files": list(pack.files),
                    "rules": [dict(zip(("section", "name", "summary", "origin"), row)) for row in rows]})
        return 0
    table(f"{directory}: {len(pack.files)} files, valid", ("section", "name", "what", "where"), rows)
    return 0


def _test_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(rule_files(path))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError("no such test file or directory", path)
    return files


def cmd_test(args: argparse.Namespace) -> int:
    rules_dir = Path(args.rules) if args.rules else None
    results = run_files(_test_files(args.files), rules_dir)
    failed = [r for r in results if not r.passed]
    if args.json:
        print_json([{"file": str(r.file), "test": r.name, "passed": r.passed, "problems": r.problems}
                    for r in results])
    else:
        for result in results:
            mark = "[green]PASS[/]" if result.passed else "[bold red]FAIL[/]"
            out_console.print(f"{mark} {result.file}: {result.name}")
            for problem in result.problems:
                out_console.print(f"     {problem}", markup=False)
        summary = f"{len(results) - len(failed)} passed, {len(failed)} failed"
        (err_console if failed else out_console).print(summary)
    return 1 if failed else 0
