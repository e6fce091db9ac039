"""The real-failure corpus (tests/data/failure_corpus/): its shape, and the
verdicts of the shipped catalogue on its test set, which no pattern was
written from (tests/corpus.py has the split)."""

from __future__ import annotations

import collections

import pytest

from tests.corpus import CORPUS, LABELS, CorpusError, load_corpus, load_excerpt, score, split
from tests.corpus_jobs import SHIPPED, costs
from trainwarden.rules.loader import load_rules

MIN_EXCERPTS = 400
MIN_NOT_RETRYABLE = 0.35
# What the shipped rule pack (catalogue and lexical model) measures on the
# test set today (79.1% of 478 overall, after 19 labels were corrected
# against their threads; the weakest large category infra_transient at
# 63%), as a floor that a change must not push it under.
# Issue 11's targets, 92% overall and 85% in every category with 10 or more
# test excerpts, are not met yet: see the README.
MIN_ACCURACY = 0.78
MIN_CATEGORY_ACCURACY = 0.60
CATEGORY_SUPPORT = 10  # categories with this many test excerpts or more are held to MIN_CATEGORY_ACCURACY
# What the shipped policy costs on the test set, each excerpt run as a job
# (tests/corpus_jobs.py; bench/classify_corpus.py prints it): 1.1% of the
# transient failures lose their job (2 of 184; 17.9% before the decisions
# of engine/operational.py) and 0.73 restarts are spent per persistent
# failure (215 for 293; 0.85 before settings.decisions.sure_rules), under
# issue 27's ceilings of 2% and 0.8: see docs/OPERATIONS.md.
MAX_LOST_SHARE = 0.012
MAX_RESTARTS_PER_PERSISTENT = 0.75

EXCERPTS = load_corpus()
TUNE, TEST = split(EXCERPTS)


def test_the_corpus_holds_at_least_400_real_excerpts_with_public_sources():
    assert len(EXCERPTS) >= MIN_EXCERPTS, len(EXCERPTS)
    for excerpt in EXCERPTS:
        assert excerpt.source.startswith("https://"), (excerpt.name, excerpt.source)
        assert excerpt.expect in LABELS
        assert excerpt.reason and len(excerpt.reason) < 600, excerpt.name


def test_at_least_35_percent_of_the_excerpts_are_not_retryable():
    counts = collections.Counter(e.expect for e in EXCERPTS)
    assert counts["not_retryable"] / len(EXCERPTS) >= MIN_NOT_RETRYABLE, counts


def test_every_file_of_the_corpus_is_valid():
    for path in sorted(CORPUS.glob("*/*.log")):
        load_excerpt(path)  # raises CorpusError naming the file


def test_a_file_without_a_reason_is_refused_naming_it(tmp_path):
    path = tmp_path / "o__r" / "1-x.log"
    path.parent.mkdir()
    path.write_text("# source: https://github.com/o/r/issues/1\n# repo: o/r\n# exit_code: 1\n"
                    "# expect: retryable\n# category: host_oom\nKilled\n")
    with pytest.raises(CorpusError, match=r"1-x\.log: header lacks reason"):
        load_excerpt(path)


def test_no_repository_is_in_both_the_tuning_and_the_test_set():
    assert not {e.repo for e in TUNE} & {e.repo for e in TEST}
    assert len(TEST) >= 100, len(TEST)


def test_the_verdict_on_the_test_set_stays_at_or_above_the_measured_figures():
    # Only figures, never which excerpts: patterns are not written from the test set.
    scores = score(load_rules(), TEST)
    assert scores.accuracy >= MIN_ACCURACY, f"{scores.accuracy:.1%} right on the test set"
    for category, (right, total) in scores.by_category().items():
        if total >= CATEGORY_SUPPORT:
            assert right / total >= MIN_CATEGORY_ACCURACY, f"{category}: {right}/{total} right on the test set"


def test_on_the_test_set_few_transient_failures_lose_their_job_and_few_restarts_go_to_persistent_ones():
    result = costs(load_rules(), TEST, SHIPPED)
    assert result.lost_share <= MAX_LOST_SHARE, f"{result.lost_share:.1%} of the transient failures lost their job"
    assert result.restarts_per_persistent <= MAX_RESTARTS_PER_PERSISTENT, (
        f"{result.restarts_per_persistent:.2f} restarts per persistent failure")


def test_every_excerpt_has_exactly_one_blind_reading_of_a_valid_verdict():
    # bench/corpus_ceiling.py sets the labels beside what a reader of the
    # lines alone concluded; a new excerpt needs its blind reading too.
    readings = collections.Counter()
    for number, line in enumerate((CORPUS / "blind_reader.tsv").read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("#"):
            continue
        name, verdict, sure, why = line.split("\t")
        assert verdict in LABELS and sure in ("sure", "unsure") and why, f"blind_reader.tsv line {number}: {line!r}"
        readings[name] += 1
    assert readings == collections.Counter(e.name for e in EXCERPTS)


def test_every_excerpt_names_the_phase_its_lines_show():
    # bench/corpus_phases.py writes it by the rule of trainwarden/evidence/phase.py.
    for path in sorted(CORPUS.glob("*/*.log")):
        head = path.read_text(encoding="utf-8").split("\n")[:12]
        assert any(line.startswith("# phase: ") for line in head), f"{path}: no '# phase:' line"
