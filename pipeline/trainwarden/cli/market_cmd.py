"""``trainwarden market``: the market service (services/market_service.py),
polling the provider ``run --market`` takes and publishing its quotes on the
bus for every processor. Parsing and printing only."""

from __future__ import annotations

import argparse

from trainwarden.bus import BusError
from trainwarden.cli import cluster_cmd
from trainwarden.cli.output import examples, fail
from trainwarden.services.market_service import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S

COMMANDS = frozenset({"market"})
TAKES_COMMAND: frozenset = frozenset()


def add_commands(sub) -> None:
    market = sub.add_parser(
        "market", help="run the market service: spot prices and stock on the bus for the processors",
        description="Polls a market provider (a trace file, or a scheme a plugin registered with register_provider) "
                    "and publishes signed market quotes that every processor reads: spot jobs submitted to the "
                    "cluster queue, start, and are released on them. Run one per market.",
        **examples("trainwarden market --market /etc/trainwarden/spot-market.yaml --bootstrap kafka:9092",
                   "trainwarden market --market mycloud://region-1 --interval 2 --metrics-address :9464"))
    cluster_cmd._option(market, "--market", help="the provider: a market trace file (its time 0 is this service's "
                                                 "start) or a registered provider's URL, e.g. mycloud://region-1")
    cluster_cmd._option(market, "--interval", env="TRAINWARDEN_MARKET_INTERVAL", type=float, default=DEFAULT_INTERVAL_S,
                        help=f"seconds between two polls of the provider (default {DEFAULT_INTERVAL_S:g})")
    cluster_cmd._option(market, "--provider-timeout", env="TRAINWARDEN_MARKET_PROVIDER_TIMEOUT", type=float,
                        default=DEFAULT_TIMEOUT_S,
                        help="seconds a provider call may take before it counts as not answering (default "
                             f"{DEFAULT_TIMEOUT_S:g})")
    cluster_cmd._service_options(market)


def spot_runtimes() -> tuple[str, ...]:
    """The runtimes whose actuator releases a spot job's instances when the
    market takes them back: those declaring Capability.PREEMPT (each runtime
    says so in its own package); the others are not wired to the market yet."""
    from trainwarden.runtime.base import Capability
    from trainwarden.runtime.registry import submitted

    return tuple(kind.name for kind in submitted() if Capability.PREEMPT in kind.capabilities)


def spot_bids(job, market: str | None):
    """A submitted job's bids checked against ``--market``: (bids, ()) or
    ((), (error, hint)) when the job cannot be submitted as it is."""
    from trainwarden.spot.market import open_market
    from trainwarden.spot.spec import check_bids

    if not job.spot:
        if market:
            return (), ("--market is for jobs with spot roles", "add a 'spot' section to a role of the job file")
        return (), ()
    roles = ", ".join(bid.role for bid in job.spot)
    wired = spot_runtimes()
    if job.runtime not in wired:
        # Nothing would release its instances when the price rises: it must not run on ordinary capacity.
        return (), (f"spot roles ({roles}) run on the {' or '.join(wired)} runtime only for now; the "
                    f"{job.runtime} runtime is not wired to the market yet",
                    "submit it with --runtime agents, or run it on one machine: trainwarden run JOB.yaml --market "
                    "TRACE")
    if not market:
        return (), (f"the job has spot roles ({roles}) but no --market to check its bids against",
                    "give the market the cluster's `trainwarden market` service polls: --market TRACE or a "
                    "provider's URL")
    return check_bids(job.spot, open_market(market)), ()


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    from trainwarden.services.market_service import MarketService
    from trainwarden.services.runner import ServiceRun
    from trainwarden.spot.market import open_market

    problem = cluster_cmd._resolve_switches(args)
    if problem:
        return fail(problem, hint="unset it or give the flag on the command line")
    if not args.market:
        return fail("the market service needs --market (or $TRAINWARDEN_MARKET)",
                    hint="give a market trace file or a registered provider's URL, as for trainwarden run --market")
    if not 0.05 <= args.interval <= 3600:
        return fail(f"--interval must be from 0.05 to 3600 seconds, not {args.interval:g}")
    if not 0.1 <= args.provider_timeout <= 3600:
        return fail(f"--provider-timeout must be from 0.1 to 3600 seconds, not {args.provider_timeout:g}")
    provider = open_market(args.market)  # a bad trace is a usage problem: ConfigError names the file and line
    try:
        run = ServiceRun("market", args.log_format, args.metrics_address)
    except OSError as exc:
        return fail(f"--metrics-address {args.metrics_address}: cannot listen there ({exc.strerror or exc})",
                    hint="give an address of this host and a free port, e.g. --metrics-address 0.0.0.0:9464")
    try:
        bus = run.open_bus(args.bootstrap, **cluster_cmd._signing(args))
        service = MarketService(bus, provider, interval_s=args.interval, timeout_s=args.provider_timeout,
                                say=lambda text: run.say("warning", text))
        run.observer.watch(lambda: service.counters, [])
        return run.run(service, f"market {provider.name} (a quote every {args.interval:g} s at most, each holding "
                                f"{service.valid_s:g} s)")
    except BusError as exc:
        return fail(str(exc), exc.hint or "is Kafka running? deploy/kafka/local-kafka start", code=1)
    finally:
        run.close()
