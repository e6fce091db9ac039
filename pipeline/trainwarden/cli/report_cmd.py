"""``trainwarden report --job ID -o report.html``: one job's history as a
self-contained HTML page (pipeline/trainwarden/report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainwarden.cli.output import examples, fail, out_console
from trainwarden.cli.stores import open_existing, store_target
from trainwarden.report import NoSuchJob, collect, latest_job, render

COMMANDS = frozenset({"report"})
TAKES_COMMAND: frozenset = frozenset()


def add_commands(sub) -> None:
    report = sub.add_parser("report", help="one job's history as a self-contained HTML page",
                            description="trainwarden report [--job ID] -o report.html: the outcome and why, "
                                        "wall time, goodput and where the rest went, the rounds, faults and stack "
                                        "reports.",
                            **examples("trainwarden report -o report.html          # the latest job",
                                       "trainwarden report --job resnet-42 -o report.html",
                                       "trainwarden report --job resnet-42 -o - > report.html"))
    report.add_argument("--job", help="the job to report on (default: the latest job submitted)")
    report.add_argument("-o", "--output", required=True, help="the HTML file to write ('-' for standard output)")
    report.add_argument("--store", help="history store directory or ClickHouse URL (default: $TRAINWARDEN_STORE "
                                        "or the per-user state directory)")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    store = store_target(args)
    try:
        # A read never makes a store: a directory no run wrote is exit 2.
        with open_existing(store) as reader:
            job = args.job or latest_job(reader)
            if job is None:
                return fail(f"the history store {store} has no job yet", hint="run one: trainwarden run JOB.yaml")
            page = render(collect(reader, job))
    except NoSuchJob:
        return fail(f"the history store {store} has no job {args.job!r}",
                    hint="'trainwarden history --jobs' lists the jobs it has")
    if args.output == "-":
        out_console.file.write(page)
        return 0
    target = Path(args.output)
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as exc:
        return fail(f"cannot write --output {args.output}: {exc.strerror}", hint="give a writable path")
    out_console.print(f"wrote {target} ({len(page) // 1024} KiB): job {job}", highlight=False)
    return 0
