"""The cost of judging one failure: a 500-line tail (the shipped
`tail_lines`) against the whole catalogue, as the engine does when an
instance exits (trainwarden.attribution.judge: traceback, signal and
cross-rank evidence, every classifier, the rank split).

Tails are the real excerpts of tests/data/failure_corpus, each padded to
500 lines with ordinary training output in front; then the same with every
line at the 16 KiB cut (the worst a tail can be), and three ranks
interleaved in one tail. Prints p50/p99/max per judgement.

    .venv/bin/python bench/classify.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "pipeline"))

from tests.corpus import load_corpus  # noqa: E402
from trainwarden.attribution import Failure, judge  # noqa: E402
from trainwarden.rules.loader import load_rules  # noqa: E402

TAIL = 500
MAX_LINE = 16 * 1024


def padded(lines: tuple[str, ...], width: int = 0) -> tuple[str, ...]:
    filler = [f"[rank0]: step {i} loss {1.0 / (i + 1):.4f} lr 3.0e-04 tokens/s 51234 | NCCL INFO Channel 00/0 : 0[0] -> 1[1]"
              for i in range(max(0, TAIL - len(lines)))]
    tail = tuple(filler) + tuple(lines)
    if width:
        tail = tuple((line + " " + "x" * width)[:MAX_LINE] for line in tail)
    return tail[-TAIL:]


def interleaved(lines: tuple[str, ...]) -> tuple[str, ...]:
    ranks = [f"[rank{r}]: " for r in range(3)]
    return tuple(ranks[i % 3] + line for i, line in enumerate(padded(lines)))


def measure(pack, tails, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        for tail in tails:
            started = time.perf_counter()
            judge(pack, [Failure("worker-0", 1, tail)])
            times.append(time.perf_counter() - started)
    return times


def row(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"| {name} | {len(times)} | {statistics.median(ordered) * 1000:.2f} ms | {p99 * 1000:.2f} ms | "
            f"{ordered[-1] * 1000:.2f} ms |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="times each tail is judged")
    args = parser.parse_args()
    pack = load_rules()
    excerpts = load_corpus()
    print(f"# Judging one failure: {len(pack.classifiers)} classifiers, {len(excerpts)} real excerpts padded to "
          f"{TAIL} lines; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| tail | judgements | p50 | p99 | max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(row("500 lines", measure(pack, [padded(e.lines) for e in excerpts], args.rounds)))
    print(row("500 lines, 3 ranks interleaved", measure(pack, [interleaved(e.lines) for e in excerpts], args.rounds)))
    print(row("500 lines of 16 KiB", measure(pack, [padded(e.lines, MAX_LINE) for e in excerpts[:60]], 1)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
