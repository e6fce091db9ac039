"""The verdicts of the shipped catalogue on the real-failure corpus, per
label and per category, on the tuning set and on the test set (which no
pattern was written from). The README quotes the test-set table.

    .venv/bin/python bench/classify_corpus.py            # both sets
    .venv/bin/python bench/classify_corpus.py --misses   # and every wrong verdict of the tuning set
    .venv/bin/python bench/classify_corpus.py --tuning-only --misses   # the tuning set alone (while tuning)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--misses", action="store_true", help="list the tuning set's wrong verdicts")
    parser.add_argument("--tuning-only", action="store_true",
                        help="judge the tuning set alone (the test set is neither judged nor printed)")
    args = parser.parse_args()
    excerpts = load_corpus()
    tune, test = split(excerpts)
    pack = load_rules()
    print(f"# Real-failure corpus: {len(excerpts)} excerpts from {len({e.repo for e in excerpts})} repositories "
          f"({len(tune)} tuning, {len(test)} test)")
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
