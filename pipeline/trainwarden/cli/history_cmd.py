"""``trainwarden history``: fault records, aggregated fault details, jobs, stages."""

from __future__ import annotations

import argparse
import os

from trainwarden.cli.output import fail, iso, print_json, table
from trainwarden.store import analytics, default_store_dir, open_reader
from trainwarden.store.records import FAULT_FIELDS

WIDE_FIELDS = ("reason", "rule", "classifier", "category", "verdict", "consequences", "error_signature",
               "record_id")


def cmd_history(args: argparse.Namespace) -> int:
    store = args.store or os.environ.get("TRAINWARDEN_STORE") or str(default_store_dir())
    filters = {"node": args.node, "source": args.source, "since": args.since}
    other = args.jobs or args.stages or getattr(args, "costs", False) or getattr(args, "spot", False)
    if other and any(v is not None for v in filters.values()):
        return fail("--since, --node and --source filter fault records, not --jobs, --stages, --costs or --spot",
                    hint="drop them, or leave out --jobs/--stages/--costs/--spot")
    with open_reader(store) as reader:
        if args.jobs:
            return _jobs(reader.jobs(job_id=args.job), args)
        if args.stages:
            return _stages(reader.restart_stages(job_id=args.job), args)
        # The same queries as the Grafana dashboards (pipeline/trainwarden/store/analytics.py).
        if args.aggregate:
            return _aggregate(analytics.run(reader, "fault_details", job=args.job, limit=args.limit, **filters), args)
        if getattr(args, "costs", False):
            return _costs(reader.job_costs(job_id=args.job), args)
        if getattr(args, "spot", False):
            return _spot(reader.spot_transitions(job_id=args.job), args)
        return _faults(analytics.run(reader, "fault_list", job=args.job, limit=args.limit, **filters), args)


def _faults(rows: list[dict], args: argparse.Namespace) -> int:
    fields = FAULT_FIELDS + (WIDE_FIELDS if args.wide else ())
    if args.json:
        print_json([{k: row[k] for k in fields} for row in rows])
        return 0
    columns = ["time", "job", "round", "node", "instance", "code", "source", "action", "result", "duration_s",
               "message"] + (["reason", "rule", "category"] if args.wide else [])
    table("Fault records", columns, (
        [iso(r["time"]), r["job_id"], r["round"], r["node_name"], r["instance_name"], r["error_code"],
         r["error_source"], r["action"], r["result"], f"{r['duration_s']:.2f}", r["error_message"]]
        + ([r["reason"], r["rule"], r["category"]] if args.wide else [])
        for r in rows), wide=("message",))
    return 0


def _aggregate(rows: list[dict], args: argparse.Namespace) -> int:
    if args.json:
        print_json(rows)
        return 0
    table("Aggregated fault details", ["count", "source", "code", "error", "node", "instance", "first", "last"], (
        [r["count"], r["error_source"], r["error_code"], r["error_signature"] or r["error_message"], r["node_name"],
         r["instance_name"], iso(r["first_time"]), iso(r["last_time"])] for r in rows), wide=("error",))
    return 0


def _jobs(rows: list[dict], args: argparse.Namespace) -> int:
    if args.json:
        print_json(rows)
        return 0
    table("Jobs", ["job", "status", "reason", "framework", "instances", "restarts", "submitted", "finished"], (
        [r["job_id"], r["status"], r["reason"], r["framework"], r["instances"], r["rounds"],
         iso(r["submitted_at"]), iso(r["finished_at"])] for r in rows))
    return 0


def _stages(rows: list[dict], args: argparse.Namespace) -> int:
    if args.json:
        print_json(rows)
        return 0

    def span(a: float, b: float) -> str:
        return f"{b - a:.2f}" if a and b else "-"

    table("Restart stages (seconds)", ["job", "round", "instance", "detected", "decide", "stop", "restart",
                                       "until running", "total"], (
        [r["job_id"], r["round"], r["instance_name"] or "(job)", iso(r["detected_at"]),
         span(r["detected_at"], r["decided_at"]), span(r["decided_at"], r["stopped_at"]),
         span(r["stopped_at"], r["restarted_at"]), span(r["restarted_at"], r["running_at"]),
         span(r["detected_at"], r["running_at"] or r["restarted_at"])] for r in rows))
    return 0


def _costs(rows: list[dict], args: argparse.Namespace) -> int:
    if args.json:
        print_json(rows)
        return 0
    table("Spot job costs (market price x time held, per instance-hour prices)",
          ["job", "state", "preemptions", "resumes", "queued_s", "held_s", "paid", "on-demand", "saving"], (
              [r["job_id"], r["state"], r["preemptions"], r["resumes"], f"{r['queued_s']:.1f}", f"{r['held_s']:.1f}",
               f"{r['paid']:.4f}", f"{r['on_demand']:.4f}",
               f"{1 - r['paid'] / r['on_demand']:.0%}" if r["on_demand"] > 0 else "-"] for r in rows))
    return 0


def _spot(rows: list[dict], args: argparse.Namespace) -> int:
    if args.json:
        print_json(rows)
        return 0
    table("Spot lifecycle", ["time", "job", "round", "state", "reason", "paid", "on-demand", "message"], (
        [iso(r["time"]), r["job_id"], r["round"], r["state"], r["reason"], f"{r['paid']:.4f}",
         f"{r['on_demand']:.4f}", r["message"]] for r in rows), wide=("message",))
    return 0
