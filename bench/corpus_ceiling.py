"""How far the lines alone can go: a blind reader's verdicts on the
real-failure corpus beside the labels and beside the shipped pipeline.

Each excerpt was read once, lines and exit code only, by a reader who saw no
label, file name, source address or verdict of ours
(tests/data/failure_corpus/blind_reader.tsv; how it was made is in
tests/data/failure_corpus/README.md). Where a careful reader of the same lines
disagrees with the label, the label rests on what the thread found, or on a
convention the lines cannot show; no classifier of the tail is expected to
do better than such a reader there.

    .venv/bin/python bench/corpus_ceiling.py           # both sets
    .venv/bin/python bench/corpus_ceiling.py --json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "pipeline"))

from tests.corpus import CORPUS, load_corpus, score, split  # noqa: E402
from trainwarden.rules.loader import load_rules  # noqa: E402

READER = CORPUS / "blind_reader.tsv"
MIN_CATEGORY = 10  # categories with fewer excerpts in a set are not listed


def load_reader(path: Path = READER) -> dict[str, tuple[str, bool]]:
    """Excerpt name -> (the reader's verdict, whether the reader was sure)."""
    read = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        name, verdict, sure, *_ = line.split("\t")
        read[name] = (verdict, sure == "sure")
    return read


def compare(excerpts, reader, pack) -> dict:
    pipeline = {o.excerpt.name: o.right for o in score(pack, excerpts).outcomes}
    total = collections.Counter()
    by_category: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for excerpt in excerpts:
        verdict, sure = reader[excerpt.name]
        reader_right = verdict == excerpt.expect
        counts = collections.Counter(excerpts=1, reader=reader_right, pipeline=pipeline[excerpt.name],
                                     sure=sure, sure_right=sure and reader_right,
                                     either=reader_right or pipeline[excerpt.name])
        total.update(counts)
        by_category[excerpt.category].update(counts)
    return {"total": dict(total), "categories": {c: dict(n) for c, n in by_category.items()}}


def _pct(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def report(name: str, figures: dict) -> None:
    t = figures["total"]
    print(f"\n## {name}: {t['excerpts']} excerpts\n")
    print(f"- the blind reader agrees with the label on {_pct(t['reader'], t['excerpts'])} "
          f"({_pct(t['sure_right'], t['sure'])} of the {t['sure']} it was sure of, "
          f"{_pct(t['reader'] - t['sure_right'], t['excerpts'] - t['sure'])} of the rest)")
    print(f"- the shipped pipeline's verdict is right for {_pct(t['pipeline'], t['excerpts'])}; "
          f"one or the other for {_pct(t['either'], t['excerpts'])}\n")
    print("| category | excerpts | blind reader | pipeline |")
    print("| --- | ---: | ---: | ---: |")
    for category, n in sorted(figures["categories"].items(), key=lambda kv: -kv[1]["excerpts"]):
        if n["excerpts"] >= MIN_CATEGORY:
            print(f"| {category} | {n['excerpts']} | {_pct(n.get('reader', 0), n['excerpts'])} "
                  f"| {_pct(n.get('pipeline', 0), n['excerpts'])} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args()
    reader = load_reader()
    tune, test = split(load_corpus())
    unread = [e.name for e in tune + test if e.name not in reader]
    if unread:
        print(f"{len(unread)} excerpts have no blind reading in {READER.name} (first: {unread[0]}); "
              "read them blind before quoting these figures", file=sys.stderr)
        return 1
    pack = load_rules()
    figures = {"tuning": compare(tune, reader, pack), "test": compare(test, reader, pack)}
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
        return 0
    print("# How far the lines alone can go: a blind reader beside the labels and the pipeline")
    report("Tuning set", figures["tuning"])
    report("Test set", figures["test"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
