"""Analysis of many stack dumps: parse and group 1,000 process dumps.

Dumps are py-spy text of 1,000 processes with 3 threads each, 30 frames deep
(the shape of a 1,000-rank hang: almost all in one collective, a few elsewhere).

    .venv/bin/python bench/stacks.py [--processes 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.diagnose.report import build_report  # noqa: E402
from trainwarden.diagnose.stacks import ProcessDump, parse_pyspy  # noqa: E402


def dump_text(pid: int, odd: bool) -> str:
    lines = [f"Process {pid}: python train.py", "Python v3.11.7", ""]
    names = ("MainThread", "data-loader", "pin-memory")
    for index, name in enumerate(names):
        lines.append(f'Thread {pid * 10 + index} (idle): "{name}"')
        top = ("load_corrupt_shard (io.py:77)" if odd else "wait (distributed_c10d.py:3402)") if index == 0 else \
            f"_worker_loop (worker.py:{300 + index})"
        lines.append(f"    {top}")
        for depth in range(29):
            lines.append(f"    frame_{depth} (module_{depth % 7}.py:{100 + depth})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=1000)
    args = parser.parse_args()
    texts = [dump_text(1000 + i, odd=(i % 331 == 7)) for i in range(args.processes)]
    started = time.perf_counter()
    dumps = []
    for i, text in enumerate(texts):
        for dump in parse_pyspy(text):
            dumps.append(ProcessDump(dump.pid, dump.threads, dump.tool, f"worker-{i}"))
    parsed = time.perf_counter()
    report = build_report(dumps)
    grouped = time.perf_counter()
    print(f"processes            {len(dumps):,} ({sum(len(d.threads) for d in dumps):,} threads, 30 frames each)")
    print(f"parse                {(parsed - started) * 1000:,.0f} ms")
    print(f"group and verdict    {(grouped - parsed) * 1000:,.0f} ms")
    print(f"total                {(grouped - started) * 1000:,.0f} ms")
    print(f"groups               {len(report.groups)}; suspects: {', '.join(report.suspects)}")


if __name__ == "__main__":
    main()
