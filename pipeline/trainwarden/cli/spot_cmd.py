"""``trainwarden simulate``: a spot job against a market trace on a virtual clock."""

from __future__ import annotations

import argparse
import dataclasses

from trainwarden.cli.output import add_output_options, examples, fail, listing, out_console, output_format
from trainwarden.cli.tables import Col
from trainwarden.jobspec import load_job_file
from trainwarden.rules.loader import load_rules
from trainwarden.simulation.spot_job import load_failures, simulate
from trainwarden.spot.market import TraceMarket, open_market
from trainwarden.spot.spec import DISCOUNT_KEY, check_bids, valid_discount

COMMANDS = frozenset({"simulate"})
TAKES_COMMAND: frozenset = frozenset()


def add_commands(sub) -> None:
    sim = sub.add_parser("simulate", help="a spot job against a market trace, on a virtual clock",
                         description="trainwarden simulate JOB.yaml --market TRACE [--failures TRACE]",
                         **examples("trainwarden simulate examples/spot-job.yaml --market examples/spot-market.yaml",
                                    "trainwarden simulate job.yaml --market trace.yaml --bid 0.3 --bid 0.5 --json"))
    sim.add_argument("job_file", help="the job YAML file (with spot roles)")
    sim.add_argument("--market", required=True, help="a market trace file (YAML; prices inline or CSV)")
    sim.add_argument("--failures", help="a failure trace (YAML) to inject instance failures")
    sim.add_argument("--duration", type=float, default=3600.0,
                     help="seconds of running the job needs to finish (default 3600)")
    sim.add_argument("--checkpoint-interval", type=float, default=0.0,
                     help="seconds of work between checkpoints; a stop loses the work since the last (default 0:"
                          " nothing is lost)")
    sim.add_argument("--bid", action="append", default=[],
                     help=f"compare bids: a {DISCOUNT_KEY} for every spot role, e.g. --bid 0.3 --bid 0.5")
    sim.add_argument("--rules", help="rules directory (default: the shipped rules)")
    add_output_options(sim, names="bid")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    if not 0 < args.duration <= 1e9:
        return fail("--duration must be seconds above 0")
    if not 0 <= args.checkpoint_interval <= 1e9:
        return fail("--checkpoint-interval must be 0 or more seconds")
    job = load_job_file(args.job_file)
    if not job.spot:
        return fail(f"{args.job_file}: the job has no spot roles to simulate",
                    hint="add a 'spot' section to a role (docs/GUIDE.md, 'Spot (preemptible) jobs')")
    market = open_market(args.market)
    if not isinstance(market, TraceMarket):
        return fail(f"--market {args.market}: only a trace can be simulated")
    failures = load_failures(args.failures, {i.name for i in job.instances()}) if args.failures else ()
    variants = [("as written", job.spot)]
    for raw in args.bid:
        try:
            value = float(raw)
        except ValueError:
            return fail(f"--bid {raw!r} is not a number", hint="a discount from 0.1 to 0.9, e.g. --bid 0.4")
        if not valid_discount(value):
            return fail(f"--bid must be 0.1 to 0.9 in steps of 0.1, not {raw}")
        variants.append((f"discount {value:g}", tuple(dataclasses.replace(b, discount=round(value, 1),
                                                                          price_limit=None) for b in job.spot)))
    pack = load_rules(args.rules)
    results = []
    for label, bids in variants:
        result = simulate(job, pack, market, check_bids(bids, market), args.duration, args.checkpoint_interval,
                          failures)
        results.append((label, result))
    listing(args, f"Simulation of {job.job_id} on {args.market}", [
        Col("bid"), Col("status", gives_way=True), Col("completed at (s)"), Col("queued (s)", drop=3),
        Col("held (s)", drop=2), Col("preemptions"), Col("restarts"), Col("paid"), Col("on-demand", drop=1),
        Col("saving")], (
        [label, r.status + (f" ({r.reason})" if r.reason and r.status == "failed" else ""),
         "-" if r.completion_s is None else f"{r.completion_s:.0f}", f"{r.queued_s:.0f}", f"{r.held_s:.0f}",
         r.preemptions, r.restarts, f"{r.paid:.4f}", f"{r.on_demand:.4f}", f"{r.saving:.0%}"]
        for label, r in results), data=[dict(bid=label, **r.to_dict()) for label, r in results],
        names=(label for label, _ in results))
    if output_format(args) in ("table", "wide") and not args.no_headers:
        for label, r in results:
            out_console.print(f"{label}: " + " → ".join(r.states))
    return 0
