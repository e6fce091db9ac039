"""Real, public failure logs are classified as labelled (issue 4, part 5).

Every file in ``tests/data/failure_logs/`` is a verbatim (only trimmed)
excerpt of a public log: a GitHub issue, pull request or repository file,
cited in its header. The header lines come first::

    # source: <URL>
    # exit_code: <N>  (how it was inferred)
    # expect: retryable|not_retryable
    # category: <catalogue category>
    # note: <optional>

The rest of the file is the instance's log tail. Each file is classified with
the shipped rule pack, and the overall accuracy (retryable and category both
right) must stay at or above 90%; the summary is printed and written to
``build/failure_logs_accuracy.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path

import pytest

from trainwarden.classify import Verdict, classify
from trainwarden.rules.loader import load_rules

DATA = Path(__file__).resolve().parent / "data" / "failure_logs"
FILES = sorted(DATA.glob("*.log"))
SUMMARY = Path(__file__).resolve().parent.parent / "build" / "failure_logs_accuracy.md"
MIN_ACCURACY = 0.90
PACK = load_rules()

_HEADER = re.compile(r"^# (source|exit_code|expect|category|note):\s?(.*)$")


@dataclasses.dataclass(frozen=True)
class Sample:
    path: Path
    source: str
    exit_code: int
    retryable: bool
    category: str
    lines: tuple[str, ...]

    @property
    def log_class(self) -> str:
        """The class named by the file name: ``<class>__<short-name>.log``."""
        return self.path.name.split("__", 1)[0]


def load_sample(path: Path) -> Sample:
    lines = path.read_text(encoding="utf-8").splitlines()
    header: dict[str, str] = {}
    body = 0
    for body, line in enumerate(lines):
        match = _HEADER.match(line)
        if match is None:
            break
        header.setdefault(match.group(1), match.group(2).strip())
    else:
        body = len(lines)
    missing = {"source", "exit_code", "expect", "category"} - header.keys()
    assert not missing, f"{path.name}: header lacks {sorted(missing)}"
    expect = header["expect"].split()[0]
    assert expect in ("retryable", "not_retryable"), f"{path.name}: expect is {expect!r}"
    tail = tuple(lines[body:])
    assert any(line.strip() for line in tail), f"{path.name}: no log excerpt after the header"
    return Sample(
        path=path,
        source=header["source"].split()[0],
        exit_code=int(header["exit_code"].split()[0]),
        retryable=expect == "retryable",
        category=header["category"].split()[0],
        lines=tail,
    )


def judge(sample: Sample) -> Verdict:
    return classify(PACK, sample.exit_code, sample.lines)


def correct(sample: Sample, verdict: Verdict) -> bool:
    return verdict.retryable == sample.retryable and verdict.category == sample.category


def test_the_corpus_is_there_and_every_file_cites_a_public_source():
    assert 30 <= len(FILES) <= 60, len(FILES)
    for path in FILES:
        sample = load_sample(path)
        assert sample.source.startswith("https://github.com/"), (path.name, sample.source)
        assert re.fullmatch(r"[a-z_]+__[\w.-]+\.log", path.name), path.name
        assert 0 <= sample.exit_code <= 255, (path.name, sample.exit_code)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_real_failure_log_is_classified_as_labelled(path: Path):
    sample = load_sample(path)
    verdict = judge(sample)
    assert (verdict.retryable, verdict.category) == (sample.retryable, sample.category), (
        f"rule {verdict.rule!r} matched {verdict.matched_line[:200]!r}"
    )


def test_the_overall_accuracy_is_at_least_90_percent():
    samples = [load_sample(path) for path in FILES]
    verdicts = [judge(sample) for sample in samples]
    hits = [correct(s, v) for s, v in zip(samples, verdicts)]
    retry_hits = [s.retryable == v.retryable for s, v in zip(samples, verdicts)]
    accuracy = sum(hits) / len(samples)
    retry_accuracy = sum(retry_hits) / len(samples)

    per_class: dict[str, list[bool]] = collections.defaultdict(list)
    for sample, hit in zip(samples, hits):
        per_class[sample.log_class].append(hit)
    rows = [f"| {name} | {len(results)} | {sum(results)} |" for name, results in sorted(per_class.items())]
    misses = [
        f"- {s.path.name}: expected {'retryable' if s.retryable else 'not_retryable'}/{s.category}, "
        f"got {'retryable' if v.retryable else 'not_retryable'}/{v.category} (rule {v.rule})"
        for s, v, hit in zip(samples, verdicts, hits) if not hit
    ]
    summary = "\n".join([
        "# Classification accuracy on real failure logs",
        "",
        f"{sum(hits)}/{len(samples)} excerpts classified right (retryable and category): {accuracy:.1%}",
        f"retryable/not retryable alone: {sum(retry_hits)}/{len(samples)} ({retry_accuracy:.1%})",
        "",
        "| class | excerpts | right |",
        "| --- | --- | --- |",
        *rows,
        "",
        "Misclassified:" if misses else "Misclassified: none",
        *misses,
        "",
    ])
    print("\n" + summary)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(summary, encoding="utf-8")
    assert accuracy >= MIN_ACCURACY, summary
