"""Throughput and memory of the pure engine on a large job.

A 10,000-instance Sync job with hang detection on receives log lines
round-robin (one tick per 1,000 lines, as a 1 s tick would see at this rate),
then one instance fails. Prints events/s, the cost of a tick, and memory.

    .venv/bin/python bench/engine.py [--instances 10000] [--events 2000000]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.engine import start_job, step  # noqa: E402
from trainwarden.events import InstanceExited, InstanceStarted, JobSubmitted, LogLine, Tick  # noqa: E402
from trainwarden.rules.loader import load_rules  # noqa: E402
from trainwarden.simulation.cluster import instance_specs  # noqa: E402

ARGS = ("--job-execution-mode=Sync --enable-job-restart=True --enable-job-hang-detection=True "
        "--job-hang-interval=1800 --enable-job-exit-hang-detection=True")


CHUNK = 100_000


def build_events(instances: int, first: int, count: int, t0: float) -> list:
    names = [f"worker-{i}" for i in range(instances)]
    events = []
    for i in range(first, first + count):
        name = names[i % instances]
        t = t0 + i / 1_000_000
        events.append(LogLine(job_id="bench", time=t, instance=name, round=0, start=0,
                              text=f"[rank{i % instances}] step {i // instances} loss 0.{i % 9973:04d} lr 3e-4"))
        if i % 1000 == 999:
            events.append(Tick(job_id="bench", time=t))
    return events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    args = parser.parse_args()

    pack = load_rules()
    t0 = 1_700_000_000.0
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.tracemalloc:
        tracemalloc.start()

    state, _ = start_job(JobSubmitted(job_id="bench", time=t0, framework="pytorch", args=ARGS,
                                      instances=instance_specs([("worker", args.instances)])), pack, t0)
    for name in state.instances:
        state, _ = step(state, InstanceStarted(job_id="bench", time=t0, instance=name, round=0, start=0), t0)

    # Events are made in chunks outside the timed part, so memory shows what
    # the engine keeps (bounded tails), not the input.
    elapsed = 0.0
    total = log_lines = 0
    for first in range(0, args.events, CHUNK):
        events = build_events(args.instances, first, min(CHUNK, args.events - first), t0)
        started = time.perf_counter()
        for event in events:
            state, decisions = step(state, event, event.time)
        elapsed += time.perf_counter() - started
        total += len(events)
        log_lines += sum(isinstance(e, LogLine) for e in events)
        print(f"\r{total:,} events", end="", file=sys.stderr)
    print(file=sys.stderr)
    del events

    tick_started = time.perf_counter()
    for _ in range(1000):
        step(state, Tick(job_id="bench", time=t0 + 2), t0 + 2)
    tick_us = (time.perf_counter() - tick_started) / 1000 * 1e6

    fail_started = time.perf_counter()
    state, decisions = step(state, InstanceExited(job_id="bench", time=t0 + 3, instance="worker-17", round=0,
                                                  start=0, exit_code=137), t0 + 3)
    fail_ms = (time.perf_counter() - fail_started) * 1000

    peak_traced = tracemalloc.get_traced_memory()[1] if args.tracemalloc else 0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"instances            {args.instances:,}")
    print(f"events               {total:,} ({log_lines:,} log lines, {total - log_lines:,} ticks)")
    print(f"engine throughput    {total / elapsed:,.0f} events/s ({elapsed:.2f} s)")
    print(f"tick (hang check)    {tick_us:.1f} µs per tick with {args.instances:,} running instances")
    print(f"judge one failure    {fail_ms:.2f} ms -> {decisions[0].kind.value} ({decisions[0].reason.value})")
    print(f"peak RSS             {rss_after / 1024:,.0f} MiB (before the job: {rss_before / 1024:,.0f} MiB)")
    if args.tracemalloc:
        print(f"peak traced by engine {peak_traced / 2**20:,.0f} MiB")
    print(f"tail kept            {pack.tail_lines} lines per instance")


if __name__ == "__main__":
    main()
