"""Annotate every excerpt of the real-failure corpus with the phase its
lines show the failure in (``# phase:``, after ``# category:``), by the rule
of ``trainwarden.evidence.phase`` (its docstring states it). An excerpt that
already has a phase keeps it: a phase corrected by hand is not overwritten.

    .venv/bin/python bench/corpus_phases.py           # count what would change
    .venv/bin/python bench/corpus_phases.py --write   # write the missing phases
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "pipeline"))

from tests.corpus import CORPUS, load_excerpt  # noqa: E402
from trainwarden.evidence.phase import failure_phase  # noqa: E402


def annotated(text: str, phase: str) -> str:
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if line.startswith("# category:"):
            return "\n".join(lines[:index + 1] + [f"# phase: {phase}"] + lines[index + 1:])
    raise ValueError("no '# category:' line")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the missing phases into the files")
    args = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    for path in sorted(CORPUS.glob("*/*.log")):
        text = path.read_text(encoding="utf-8")
        if any(line.startswith("# phase:") for line in text.split("\n")[:12]):
            counts["kept"] += 1
            continue
        phase = failure_phase(load_excerpt(path).lines)
        counts[phase] += 1
        if args.write:
            path.write_text(annotated(text, phase), encoding="utf-8")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
