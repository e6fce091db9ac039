"""Catastrophic-backtracking patterns cost linear time: catalogue patterns
are RE2, so a job that prints the worst line for a rule cannot stall the
classifier."""

import time

from trainwarden.classify import classify
from trainwarden.rules.loader import load_rules


def test_a_backtracking_pattern_on_a_long_hostile_line_is_judged_in_linear_time(tmp_path):
    (tmp_path / "10-evil.yaml").write_text(
        "version: 1\nclassifiers:\n  - name: evil\n    category: user_code_error\n    retryable: false\n"
        "    patterns: ['(a+)+$', '(x|x|x)*y', '(.*a){20}']\n")
    pack = load_rules(tmp_path)
    hostile = ["a" * 100_000 + "!", "x" * 100_000, "a" * 50_000]
    started = time.monotonic()
    verdict = classify(pack, 1, hostile)
    assert time.monotonic() - started < 2.0
    assert verdict.rule == "evil"  # '(.*a){20}' matches the last line
