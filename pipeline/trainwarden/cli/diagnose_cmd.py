"""``trainwarden stacks`` (stored reports, offline analysis) and
``trainwarden advise hang-interval``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.text import Text

from trainwarden.cli.output import examples, fail, out_console, print_json, table
from trainwarden.cli.stores import job_known, no_such_job, open_existing, store_target
from trainwarden.diagnose.advice import advise
from trainwarden.diagnose.report import build_report
from trainwarden.diagnose.stacks import parse_any, split_concatenated
from trainwarden.yamlsrc import ConfigError

COMMANDS = frozenset({"stacks", "advise"})
TAKES_COMMAND: frozenset = frozenset()
MAX_DUMP_BYTES = 64 * 1024 * 1024

STACKS_SQL = (
    "SELECT report_id, job_id, toUnixTimestamp64Milli(time) AS time_ms, round, tool, processes, groups, suspects,"
    " verdict, missing, report_json FROM stack_reports FINAL"
    " WHERE job_id = {job_id:String} AND ({round:Int64} < 0 OR round = {round:Int64})"
    " ORDER BY time, report_id"
)


def add_commands(sub) -> None:
    stacks = sub.add_parser("stacks", help="stack reports of hung jobs; 'stacks analyze FILE...' for saved dumps",
                            description="trainwarden stacks --job ID [--round N] | trainwarden stacks analyze FILE...",
                            **examples("trainwarden stacks --job resnet-42", "trainwarden stacks --job resnet-42 "
                                       "--round 1 --json", "trainwarden stacks analyze worker-*.dump"))
    actions = stacks.add_subparsers(dest="stacks_action", metavar="analyze", parser_class=sub._parser_class)
    analyze = actions.add_parser("analyze", help="group the stacks of saved py-spy, pystack or faulthandler dumps",
                                 **examples("trainwarden stacks analyze rank0.txt rank1.txt",
                                            "py-spy dump --pid 1234 | trainwarden stacks analyze - --json"))
    analyze.add_argument("files", nargs="+", help="dump files (one per process, or concatenated); - for stdin")
    analyze.add_argument("--json", action="store_true", help="JSON for machines")
    stacks.add_argument("--job", help="the job whose reports to show")
    stacks.add_argument("--round", type=int, default=-1, help="only this round")
    stacks.add_argument("--json", action="store_true", help="JSON for machines")
    stacks.add_argument("--store", help="history store (default: $TRAINWARDEN_STORE or the per-user state dir)")
    advise_cmd = sub.add_parser("advise", help="advice from a job's log",
                                **examples("trainwarden advise hang-interval worker-0.log",
                                           "kubectl logs job-worker-0 | trainwarden advise hang-interval - --json"))
    advise_cmd.add_argument("topic", choices=("hang-interval",),
                            help="hang-interval: a --job-hang-interval longer than the collective watchdog's timeout")
    advise_cmd.add_argument("file", help="a log file, or - for standard input")
    advise_cmd.add_argument("--json", action="store_true", help="JSON for machines")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    if args.command == "advise":
        return _advise(args)
    if getattr(args, "stacks_action", None) == "analyze":
        return _analyze(args)
    if not args.job:
        return fail("'stacks' needs --job ID (or 'analyze FILE...')")
    return _stored(args)


def _read(name: str) -> str:
    import sys

    if name == "-":
        return sys.stdin.buffer.read(MAX_DUMP_BYTES).decode("utf-8", errors="replace")
    try:
        with open(name, "rb") as handle:
            return handle.read(MAX_DUMP_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", name) from None


def _analyze(args: argparse.Namespace) -> int:
    dumps = []
    for index, name in enumerate(args.files):
        text = _read(name)
        label = Path(name).stem if name != "-" else "stdin"
        for part_index, part in enumerate(split_concatenated(text)):
            for dump in parse_any(part, pid=index * 1000 + part_index):
                dumps.append(type(dump)(dump.pid, dump.threads, dump.tool, dump.instance or label))
    if not dumps:
        return fail("no stack dump found in these files",
                    hint="give py-spy dump, pystack remote or faulthandler output")
    report = build_report(dumps)
    if args.json:
        print_json(json.loads(report.to_json()))
    else:
        out_console.print(report.text(), markup=False)
    return 0


def _stored(args: argparse.Namespace) -> int:
    store = store_target(args)
    with open_existing(store) as reader:
        rows = reader.select(STACKS_SQL, {"job_id": args.job, "round": args.round})
        if not rows and not job_known(reader, args.job):
            return no_such_job(store, args.job)
    reports = [dict(row, time=int(row.pop("time_ms")) / 1000, report=json.loads(row.pop("report_json")))
               for row in rows]
    if args.json:
        print_json(reports)
        return 0
    if not reports:
        out_console.print(f"No stack reports for job {args.job}.", markup=False)
        return 0
    for item in reports:
        out_console.print(Text.assemble((f"round {item['round']}", "bold"), f": {item['verdict']}"), highlight=False)
        report = item["report"]
        table(f"{item['processes']} processes ({item['tool'] or 'no tool'}); "
              f"{len(report['groups'])} distinct stacks", ["count", "threads", "innermost frames"],
              ([group["count"], ", ".join(group["threads"][:4]) + (" ..." if group["count"] > 4 else ""),
                " <- ".join(f"{f['function']} ({f['file']}:{f['line']})" for f in group["frames"][:4])]
               for group in report["groups"]), wide=("innermost frames",))
        for note in report["missing"]:
            out_console.print(f"  missing: {note}", markup=False)
    return 0


def _advise(args: argparse.Namespace) -> int:
    advice = advise(_read(args.file).splitlines())
    if advice is None:
        if args.json:
            print_json({"found": False})
            return 0
        out_console.print("No collective watchdog timeout in this log: nothing to advise.")
        return 0
    if args.json:
        print_json({"found": True, "timeout_s": advice.timeout_s, "advised_interval_s": advice.advised_s,
                    "line": advice.line})
        return 0
    out_console.print(f"{advice.advised_s}", highlight=False)
    out_console.print(f"[dim]{advice.text()}[/]", highlight=False)
    return 0
