"""``trainwarden history``: fault records, aggregated fault details, jobs, stages."""

from __future__ import annotations

import argparse

from trainwarden.cli.output import EMPTY, fail, iso, listing
from trainwarden.cli.stores import job_known, no_such_job, open_existing, store_target
from trainwarden.cli.tables import Col, time_col
from trainwarden.store import analytics
from trainwarden.store.records import FAULT_FIELDS

WIDE_FIELDS = ("reason", "rule", "classifier", "category", "verdict", "consequences", "evidence",
               "error_signature", "record_id")


def cmd_history(args: argparse.Namespace) -> int:
    store = store_target(args)
    filters = {"node": args.node, "source": args.source, "since": args.since}
    other = args.jobs or args.stages or getattr(args, "costs", False) or getattr(args, "spot", False)
    if other and any(v is not None for v in filters.values()):
        return fail("--since, --node and --source filter fault records, not --jobs, --stages, --costs or --spot",
                    hint="drop them, or leave out --jobs/--stages/--costs/--spot")
    with open_existing(store) as reader:
        if args.job and not job_known(reader, args.job):
            return no_such_job(store, args.job)
        if args.jobs:
            return _jobs(reader.jobs(job_id=args.job), args)
        if args.stages:
            return _stages(reader.restart_stages(job_id=args.job), args)
        if getattr(args, "costs", False):
            return _costs(reader.job_costs(job_id=args.job), args)
        if getattr(args, "spot", False):
            return _spot(reader.spot_transitions(job_id=args.job), args)
        # The same queries as the Grafana dashboards (pipeline/trainwarden/store/analytics.py).
        query = "fault_details" if args.aggregate else "fault_list"
        rows = analytics.run(reader, query, job=args.job, limit=args.limit, **filters)
        empty = _unmatched(reader, args, filters) if not rows else EMPTY
        return (_aggregate if args.aggregate else _faults)(rows, args, empty)


def _unmatched(reader, args: argparse.Namespace, filters: dict) -> str:
    """Why no fault record is shown: none at all, or none that the filters let through."""
    given = [f"--{name} {value}" for name, value in (("job", args.job), ("node", args.node),
                                                     ("source", args.source)) if value]
    if args.since is not None:
        given.append(f"--since {getattr(args.since, 'text', args.since)}")
    if not given or not reader.faults(limit=1):
        return EMPTY
    return f"no fault record matches {' '.join(given)}; the store has others (drop a filter to see them)."


def _faults(rows: list[dict], args: argparse.Namespace, empty: str) -> int:
    wide = args.wide or getattr(args, "output", None) == "wide"
    fields = FAULT_FIELDS + (WIDE_FIELDS if wide else ())
    # On a narrow terminal the columns an operator needs least go first; the
    # action taken (what happened to the job) is never hidden.
    columns = [time_col("time"), Col("job"), Col("round", drop=3), Col("node", drop=6), Col("instance"),
               Col("code", drop=5), Col("source", drop=4), Col("action"), Col("result", drop=2),
               Col("duration_s", drop=1), Col("message", gives_way=True)]
    if wide:
        columns += [Col("reason"), Col("rule"), Col("category")]
    return listing(args, "Fault records", columns, (
        [iso(r["time"]), r["job_id"], r["round"], r["node_name"], r["instance_name"], r["error_code"],
         r["error_source"], r["action"], r["result"], f"{r['duration_s']:.2f}", r["error_message"]]
        + ([r["reason"], r["rule"], r["category"]] if wide else [])
        for r in rows), data=[{k: row[k] for k in fields} for row in rows],
        names=(r["record_id"] for r in rows), empty=empty)


def _aggregate(rows: list[dict], args: argparse.Namespace, empty: str) -> int:
    columns = [Col("count"), Col("source", drop=2), Col("code"), Col("error", gives_way=True), Col("node"),
               Col("instance"), time_col("first", drop=1), time_col("last", drop=3)]
    return listing(args, "Aggregated fault details", columns, (
        [r["count"], r["error_source"], r["error_code"], r["error_signature"] or r["error_message"], r["node_name"],
         r["instance_name"], iso(r["first_time"]), iso(r["last_time"])] for r in rows),
        data=rows, names=(r["error_signature"] or r["error_message"] for r in rows), empty=empty)


def _jobs(rows: list[dict], args: argparse.Namespace) -> int:
    columns = [Col("job"), Col("status"), Col("reason", gives_way=True), Col("framework", drop=1),
               Col("instances"), Col("restarts"), time_col("submitted", drop=3), time_col("finished", drop=2)]
    return listing(args, "Jobs", columns, (
        [r["job_id"], r["status"], r["reason"], r["framework"], r["instances"], r["rounds"],
         iso(r["submitted_at"]), iso(r["finished_at"])] for r in rows), data=rows, names=(r["job_id"] for r in rows))


def _stages(rows: list[dict], args: argparse.Namespace) -> int:
    def span(a: float, b: float) -> str:
        return f"{b - a:.2f}" if a and b else "-"

    columns = [Col("job"), Col("round"), Col("instance"), time_col("detected", drop=1), Col("decide"), Col("stop"),
               Col("restart"), Col("until running", drop=2), Col("total")]
    return listing(args, "Restart stages (seconds)", columns, (
        [r["job_id"], r["round"], r["instance_name"] or "(job)", iso(r["detected_at"]),
         span(r["detected_at"], r["decided_at"]), span(r["decided_at"], r["stopped_at"]),
         span(r["stopped_at"], r["restarted_at"]), span(r["restarted_at"], r["running_at"]),
         span(r["detected_at"], r["running_at"] or r["restarted_at"])] for r in rows),
        data=rows, names=(r["job_id"] for r in rows))


def _costs(rows: list[dict], args: argparse.Namespace) -> int:
    columns = [Col("job"), Col("state"), Col("preemptions"), Col("resumes"), Col("queued_s", drop=2),
               Col("held_s", drop=1), Col("paid"), Col("on-demand"), Col("saving")]
    return listing(args, "Spot job costs (market price x time held, per instance-hour prices)", columns, (
        [r["job_id"], r["state"], r["preemptions"], r["resumes"], f"{r['queued_s']:.1f}", f"{r['held_s']:.1f}",
         f"{r['paid']:.4f}", f"{r['on_demand']:.4f}",
         f"{1 - r['paid'] / r['on_demand']:.0%}" if r["on_demand"] > 0 else "-"] for r in rows),
        data=rows, names=(r["job_id"] for r in rows))


def _spot(rows: list[dict], args: argparse.Namespace) -> int:
    columns = [time_col("time"), Col("job"), Col("round"), Col("state"), Col("reason", drop=1), Col("paid"),
               Col("on-demand", drop=2), Col("message", gives_way=True)]
    return listing(args, "Spot lifecycle", columns, (
        [iso(r["time"]), r["job_id"], r["round"], r["state"], r["reason"], f"{r['paid']:.4f}",
         f"{r['on_demand']:.4f}", r["message"]] for r in rows), data=rows, names=(r["record_id"] for r in rows))
