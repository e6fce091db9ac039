"""How fast `trainwarden simulate` replays a market: a day of trace (one price
a minute) against a two-worker spot job at several bids, on the pure engine.

    .venv/bin/python bench/simulate.py [--hours 24] [--step 60] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.events import SpotBid  # noqa: E402
from trainwarden.jobspec import from_command  # noqa: E402
from trainwarden.rules.loader import load_rules  # noqa: E402
from trainwarden.simulation.spot_job import simulate  # noqa: E402
from trainwarden.spot.market import TraceMarket  # noqa: E402
from trainwarden.spot.synthetic import write_trace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--step", type=float, default=60.0, help="seconds between price rows")
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    pack = load_rules()
    job = from_command(["python3", "train.py"], 2, "--enable-job-restart=True", "bench-spot")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        market = TraceMarket.load(write_trace(Path(tmp), hours=opts.hours, step_s=opts.step))
        load_s = time.perf_counter() - started
    rows = len(market.change_times())
    print(f"trace: {opts.hours:g} h, {rows} price rows; generated and loaded in {load_s * 1000:.0f} ms")
    # A job needing more work than the day holds replays the whole trace.
    for discount in (0.3, 0.4, 0.5, 0.7):
        bids = (SpotBid(role="worker", instance_type="ecs.g7.xlarge", count=2, discount=discount),)
        best = float("inf")
        for _ in range(opts.repeat):
            started = time.perf_counter()
            result = simulate(job, pack, market, bids, duration_s=opts.hours * 3600 * 2, checkpoint_s=600)
            best = min(best, time.perf_counter() - started)
        print(f"discount {discount}: {best * 1000:7.1f} ms for the whole trace ({rows / best:,.0f} market updates/s);"
              f" {result.preemptions} preemptions, held {result.held_s / 3600:.1f} h, queued "
              f"{result.queued_s / 3600:.1f} h, paid {result.paid:.2f} vs on-demand {result.on_demand:.2f}")


if __name__ == "__main__":
    main()
