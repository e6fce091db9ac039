"""``trainwarden rules validate`` and ``rules test``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from trainwarden.cli.output import err_console, out_console, print_json, table
from trainwarden.rules.loader import load_rules, rule_files, shipped_rules_dir
from trainwarden.rules.testing import run_files
from trainwarden.yamlsrc import ConfigError


def cmd_validate(args: argparse.Namespace) -> int:
    directory = Path(args.directory) if args.directory else shipped_rules_dir()
    pack = load_rules(directory)
    rows = ([("classifier", c.name, f"{c.category}, {c.verdict.value.replace('_', ' ')}, "
              f"priority {c.priority}" + (", aftermath" if c.aftermath else ""), str(c.origin))
             for c in pack.classifiers]
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
            out_console.print(f"{mark} {escape(str(result.file))}: {escape(result.name)}")
            for problem in result.problems:
                out_console.print(f"     {problem}", markup=False)
        summary = f"{len(results) - len(failed)} passed, {len(failed)} failed"
        (err_console if failed else out_console).print(summary)
    return 1 if failed else 0
