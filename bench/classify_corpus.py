"""What the shipped policy costs on the real-failure corpus, and the
verdicts of the shipped catalogue on it, per label and per category, on the
tuning set and on the test set (which no pattern was written from). The
README quotes the test-set figures.

First, each test excerpt (with --tuning-only, each tuning excerpt) run as a
job through the engine on the virtual clock (tests/corpus_jobs.py says
how): the share of transient failures whose job is lost and the restarts
spent per persistent failure, for the shipped policy beside always retrying
and torchrun's default (--max-restarts=0).

    .venv/bin/python bench/classify_corpus.py            # both sets
    .venv/bin/python bench/classify_corpus.py --unknown-phase initialisation   # excerpts of unknown phase fail before any step
    .venv/bin/python bench/classify_corpus.py --misses   # and every wrong verdict of the tuning set
    .venv/bin/python bench/classify_corpus.py --tuning-only --misses   # the tuning set alone (while tuning), costs too
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "pipeline"))

from tests.corpus import Scores, load_corpus, score, split  # noqa: E402
from tests.corpus_jobs import POLICIES, UNKNOWN_AS, by_phase, costs  # noqa: E402
from trainwarden.rules.loader import load_rules  # noqa: E402


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def report(name: str, scores: Scores) -> None:
    print(f"\n## {name}: {len(scores.outcomes)} excerpts, verdict right for {scores.accuracy:.1%}\n")
    print("| expected | excerpts | verdict right |")
    print("| --- | ---: | ---: |")
    for label, (right, total) in scores.by_label().items():
        print(f"| {label} | {total} | {right} ({right / total:.0%}) |")
    print("\n| category | excerpts | verdict right | category precision | category recall |")
    print("| --- | ---: | ---: | ---: | ---: |")
    pr = scores.category_precision_recall()
    for category, (right, total) in scores.by_category().items():
        precision, recall, _ = pr[category]
        print(f"| {category} | {total} | {right} ({right / total:.0%}) | {_pct(precision)} | {_pct(recall)} |")


def report_costs(pack, excerpts, unknown_as: str, set_name: str = "test set") -> None:
    print(f"\n## What a policy costs, {set_name} ({sum(e.expect != 'unknown' for e in excerpts)} excerpts run as "
          f"jobs; phase unknown run as {unknown_as})\n")
    print("| policy | transient failures whose job is lost | restarts per persistent failure | "
          "restarts per transient failure |")
    print("| --- | ---: | ---: | ---: |")
    shipped = None
    for name, args in POLICIES:
        result = costs(pack, excerpts, args, unknown_as)
        shipped = shipped or result
        lost = sum(r.lost for r in result.transient)
        print(f"| {name} | {result.lost_share:.1%} ({lost} of {len(result.transient)}) | "
              f"{result.restarts_per_persistent:.2f} | {result.restarts_per_transient:.2f} |")
    print("\n| phase (as the lines show it) | transient | lost (shipped) | persistent | restarts (shipped) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for phase, (transient, lost, persistent, restarts) in by_phase(shipped.runs).items():
        print(f"| {phase} | {transient} | {lost} | {persistent} | {restarts} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--misses", action="store_true", help="list the tuning set's wrong verdicts")
    parser.add_argument("--tuning-only", action="store_true",
                        help="judge the tuning set alone (the test set is neither judged nor printed)")
    parser.add_argument("--unknown-phase", choices=UNKNOWN_AS, default=UNKNOWN_AS[0],
                        help="how an excerpt whose lines do not show its phase is run (default: %(default)s)")
    parser.add_argument("--costs-only", action="store_true", help="print the costs alone (no verdict tables)")
    args = parser.parse_args()
    excerpts = load_corpus()
    tune, test = split(excerpts)
    pack = load_rules()
    print(f"# Real-failure corpus: {len(excerpts)} excerpts from {len({e.repo for e in excerpts})} repositories "
          f"({len(tune)} tuning, {len(test)} test)")
    report_costs(pack, tune if args.tuning_only else test, args.unknown_phase,
                 "tuning set" if args.tuning_only else "test set")
    if args.costs_only:
        return 0
    tune_scores = score(pack, tune)
    report("Tuning set", tune_scores)
    if args.tuning_only:
        alone = score(dataclasses.replace(pack, lexical=None), tune).accuracy
        print(f"\nOn the tuning set: {tune_scores.accuracy:.1%} right; the catalogue alone {alone:.1%}.")
        _misses(tune_scores, args.misses)
        return 0
    test_scores = score(pack, test)
    report("Test set (no pattern written from it)", test_scores)
    alone = score(dataclasses.replace(pack, lexical=None), test).accuracy
    restart_all = sum(e.expect == "retryable" for e in test) / len(test)
    print(f"\nOn the test set: {test_scores.accuracy:.1%} right; the catalogue alone (no lexical model) "
          f"{alone:.1%}; restarting every failure {restart_all:.1%}.")
    _misses(tune_scores, args.misses)
    return 0


def _misses(tune_scores: Scores, wanted: bool) -> None:
    if not wanted:
        return
    print("\n## Tuning set, wrong verdicts\n")
    for outcome in tune_scores.wrong():
        e = outcome.excerpt
        print(f"- {e.name}: expected {e.expect}/{e.category}, got {outcome.verdict}/{outcome.category} "
              f"({outcome.rule})")


if __name__ == "__main__":
    raise SystemExit(main())
