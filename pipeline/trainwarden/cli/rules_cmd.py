"""``trainwarden rules validate`` and ``rules test``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from trainwarden.cli.output import err_console, listing, out_console, output_format, print_json
from trainwarden.cli.tables import Col
from trainwarden.rules.loader import load_rule_files, rule_files, shipped_rules_dir
from trainwarden.simulation.rule_tests import run_files
from trainwarden.yamlsrc import ConfigError


def cmd_validate(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.paths] or [shipped_rules_dir()]
    try:
        pack = load_rule_files(_rule_paths(paths))
    except ConfigError as exc:
        if output_format(args) != "json":
            raise  # main prints every mistake, file:line each
        errors = getattr(exc, "errors", [exc])
        print_json({"valid": False, "errors": [{"file": e.path, "line": e.line,
                                                "message": str(e).removeprefix(f"{e.path}:{e.line}: ")}
                                               for e in errors],
                    "more_errors": getattr(exc, "more", 0)})
        return 2
    rows = ([("classifier", c.name, f"{c.category}, {c.verdict.value.replace('_', ' ')}, "
              f"priority {c.priority}" + (", aftermath" if c.aftermath else ""), str(c.origin))
             for c in pack.classifiers]
            + [("response", r.name, f"{r.action.value} ({r.reason.value})", str(r.origin)) for r in pack.responses]
            + [("limit", lim.name, f"{lim.kind.value} -> fail_job ({lim.reason.value})", str(lim.origin))
               for lim in pack.limits]
            + [("detector", d.name, f"{d.kind.value} -> {d.action.value}", str(d.origin)) for d in pack.detectors])
    where = ", ".join(str(p) for p in paths)
    return listing(args, f"{where}: {len(pack.files)} files, valid",
                   [Col("section"), Col("name"), Col("what", gives_way=True), Col("where", drop=1)], rows,
                   data={"valid": True, "files": list(pack.files),
                         "rules": [dict(zip(("section", "name", "summary", "origin"), row)) for row in rows]},
                   names=(f"{section}/{name}" for section, name, _, _ in rows))


def _rule_paths(paths: list[Path]) -> list[Path]:
    """Files as given, directories as their rule files in name order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(rule_files(path))
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError("no such rule file or directory", path, hint="give YAML rule files or directories")
    return found


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
