"""History at scale: 10 million fault records in the embedded chDB store.

    .venv/bin/python bench/history.py                  # 10,000,000 records
    .venv/bin/python bench/history.py --records 1000000 --keep /tmp/store

Seeds the fault_records table inside ClickHouse (INSERT ... SELECT FROM
numbers(), in batches of 1 million rows: the seeding speed is not the point)
with a realistic spread: 2,000 jobs over 90 days, 500 nodes, 64 instances
per job, the engine's error sources, 300 normalised messages, and 10 % of the
records stored twice (pending, then done) as the actuator writes them. Then
it times, on the same code path as `trainwarden history` and the dashboards
(pipeline/trainwarden/store/analytics.py):

- the aggregated fault details over the whole history, and over the last 7 days;
- the per-job queries: one job's fault records, and its rounds;
- worst nodes and restarts over time (the Overview dashboard);

once as inserted, and once after `trainwarden store optimize` (the merged
state a ClickHouse server reaches by itself in the background).

Separately, the service write path on a smaller count: records appended to
the spool by SpoolWriter (what the actuator and `trainwarden run` do, one
write per decision and in batches), the ingest of that spool into chDB, and
a direct batched insert.

Prints numbers; asserts nothing (docs/PERFORMANCE.md quotes them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.events import ErrorSource  # noqa: E402
from trainwarden.store import SpoolWriter, analytics  # noqa: E402
from trainwarden.store.embedded import EmbeddedStore  # noqa: E402
from trainwarden.store.records import FaultRecord  # noqa: E402

T_END = 1_790_000_000  # the newest record (seconds); the history spans 90 days before it
SPAN_S = 90 * 86400
JOBS = 2000
BATCH = 1_000_000
SOURCES = [s.value for s in ErrorSource]


def _seed_sql(start: int, count: int, version: str) -> str:
    # Record n belongs to job n % JOBS; within a job, time grows with n, so
    # rows arrive roughly in time order, as they do from the services.
    sources = "[" + ", ".join(f"'{s}'" for s in SOURCES) + "]"
    where = "" if version == "done" else "WHERE number % 10 = 0"
    return f"""
INSERT INTO fault_records
SELECT
    concat('r', toString(number)) AS record_id,
    concat('job-', toString(number % {JOBS})) AS job_id,
    toDateTime64({T_END - SPAN_S} + intDiv(number * {SPAN_S}, {{total:UInt64}}) + (number % 1000) / 1000, 3, 'UTC')
        AS time,
    toUInt32(intDiv(number, {JOBS}) % 200) AS round,
    concat('node-', toString(cityHash64(number % {JOBS}, instance_slot, period) % 500)) AS node_name,
    concat('worker-', toString(instance_slot)) AS instance_name,
    toInt32([1, 137, 139, -6, 0, 1, 1, 2][kind % 8 + 1]) AS error_code,
    concat('RuntimeError: error ', toString(kind), ' on rank ', toString(number % 64)) AS error_message,
    {sources}[kind % {len(SOURCES)} + 1] AS error_source,
    'restart_job' AS action,
    '{version}' AS result,
    if('{version}' = 'done', 12.5, 0) AS duration_s,
    'retryable_failure' AS reason,
    'default.restart' AS rule,
    'cuda_oom' AS classifier,
    'oom' AS category,
    concat('RuntimeError: error ', toString(kind), ' on rank <n>') AS error_signature,
    time + if('{version}' = 'done', 30, 0) AS updated_at
FROM (
    -- Faults repeat: a job fails again and again in one of a few ways (its
    -- modes: an error on an instance, on the node that instance is placed on
    -- in that period), and 2 % of the faults are one-offs with any error on
    -- any instance. Errors are skewed: a few are most of the faults.
    SELECT number,
           cityHash64(number, 6) % 100 < 2 AS noise,
           cityHash64(number % {JOBS}, if(noise, number, cityHash64(number, 5) % 3)) AS mode,
           toUInt32(floor(300 * pow((mode % 1000000) / 1000000, 3))) AS kind,
           intDiv(mode, 1000000) % 64 AS instance_slot,
           intDiv(number * 6, {{total:UInt64}}) AS period
    FROM numbers({start}, {count})
)
{where}
"""


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times), result


def seed(store: EmbeddedStore, total: int) -> float:
    started = time.perf_counter()
    with store._using() as sql:
        for version in ("pending", "done"):
            for start in range(0, total, BATCH):
                count = min(BATCH, total - start)
                sql._run(_seed_sql(start, count, version), params={"total": total}, what="seeding")
    return time.perf_counter() - started


def bench_queries(store: EmbeddedStore, repeat: int) -> None:
    day = 86400
    cases = [
        # The dashboard's table and `history --aggregate --limit 1000`: the
        # 1,000 most frequent groups.
        ("aggregated fault details, whole history", "fault_details", {"limit": 1000}),
        ("aggregated fault details, last 7 days", "fault_details",
         {"since": T_END - 7 * day, "until": T_END, "limit": 1000}),
        ("aggregated fault details, one node, 90 days", "fault_details", {"node": "node-17", "limit": 1000}),
        ("per job: fault records of job-42", "fault_list", {"job": "job-42"}),
        ("per job: aggregated fault details of job-42", "fault_details", {"job": "job-42"}),
        ("worst nodes, whole history", "worst_nodes", {"limit": 20}),
        ("restarts over time, 90 days by 1 h", "restarts_over_time", {"interval_s": 3600}),
    ]
    with store._using() as sql:
        rows = sql.select("SELECT count() AS n FROM fault_records FINAL")[0]["n"]
        parts = sql.select("SELECT count() AS n, sum(rows) AS r, sum(bytes_on_disk) AS b FROM system.parts"
                           " WHERE active AND database = currentDatabase() AND table = 'fault_records'")[0]
        print(f"fault_records: {int(rows):,} records ({int(parts['r']):,} rows with versions) in {parts['n']} parts,"
              f" {int(parts['b']) / 2**20:.0f} MiB on disk")
        groups = sql.select("SELECT count() AS n FROM (SELECT 1 FROM fault_records FINAL GROUP BY error_source,"
                            " error_code, error_signature, node_name, instance_name)")[0]["n"]
        print(f"{int(groups):,} distinct (source, code, message, node, instance) groups")
        print(f"{'query':<48} {'best':>9} {'median':>9} {'rows':>8}")
        for label, name, filters in cases:
            best, median, result = _timed(lambda: analytics.run(sql, name, **filters), repeat)
            print(f"{label:<48} {best * 1000:7.0f} ms {median * 1000:7.0f} ms {len(result):>8,}")


def bench_writes(directory: Path, count: int) -> None:
    def record(i: int, version: str = "pending") -> FaultRecord:
        now = T_END + i / 1000
        return FaultRecord(record_id=f"w{i}", job_id=f"job-{i % 50}", time=now, round=i % 7,
                           node_name=f"node-{i % 40}", instance_name=f"worker-{i % 8}", error_code=1,
                           error_message=f"RuntimeError: error {i % 30}", error_source="instance_exit",
                           action="restart_job", result=version, duration_s=0.0, reason="retryable_failure",
                           rule="default", classifier="", category="", error_signature="RuntimeError: error <n>",
                           updated_at=now)

    spool_dir = directory / "writes"
    writer = SpoolWriter(spool_dir)
    single = min(count, 2000)
    started = time.perf_counter()
    for i in range(single):
        writer.write([record(i)])  # what the actuator does: one write per decision
    one_by_one = time.perf_counter() - started
    started = time.perf_counter()
    for first in range(single, count, 1000):
        writer.write([record(i) for i in range(first, min(first + 1000, count))])
    batched = time.perf_counter() - started
    store = EmbeddedStore(spool_dir)
    started = time.perf_counter()
    report = store.ingest()  # the first open already ingests; this is the timing of the whole catch-up
    ingest_s = time.perf_counter() - started
    print(f"spool, one record per write (fsync'd segment): {single / one_by_one:10,.0f} records/s ({single:,})")
    print(f"spool, 1000 records per write:                {(count - single) / batched:10,.0f} records/s "
          f"({count - single:,})")
    print(f"open + ingest of the spool into chDB:          {count / ingest_s:10,.0f} records/s "
          f"({count:,} records; {report.segments} segments left for the call)")
    direct = [record(count + i, "done") for i in range(count)]
    started = time.perf_counter()
    for first in range(0, count, 10_000):
        store.write(direct[first:first + 10_000])
    print(f"direct batched insert (10,000 per INSERT):     {count / (time.perf_counter() - started):10,.0f} "
          f"records/s ({count:,})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--writes", type=int, default=100_000, help="records for the write-path benchmark")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", help="keep the store in this directory (default: a temporary one, removed)")
    args = parser.parse_args()
    directory = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="trainwarden-bench-history-"))
    # Other work on the machine shows in the numbers: say how busy it was.
    print(f"chDB store in {directory}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    try:
        store = EmbeddedStore(directory / "store")
        print(f"seeded {args.records:,} fault records in {seed(store, args.records):.1f} s")
        print("\n-- as inserted (versions in separate parts: FINAL merges while reading)")
        bench_queries(store, args.repeat)
        started = time.perf_counter()
        store.optimize()
        print(f"\n-- after `trainwarden store optimize` ({time.perf_counter() - started:.1f} s): one part per month")
        bench_queries(store, args.repeat)
        print()
        bench_writes(directory, args.writes)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
