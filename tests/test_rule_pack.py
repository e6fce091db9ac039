"""The shipped rule pack loads, and its own rule tests (rules/tests) pass."""

from pathlib import Path

import pytest

from trainwarden.rules.loader import load_rules, shipped_rules_dir
from trainwarden.simulation.rule_tests import parse_test_file, run_files

TESTS = sorted((shipped_rules_dir() / "tests").glob("*.yaml"))


def test_the_shipped_rule_pack_is_valid_and_complete():
    pack = load_rules()
    assert {d.name for d in pack.detectors} == {"job_hang", "job_exit_hang"}
    assert {lim.name for lim in pack.limits} >= {"failure_rate", "same_error_limit", "job_restart_switch",
                                                  "job_restart_limit", "instance_restart_limit"}
    categories = {c.category for c in pack.classifiers}
    assert {"collective_timeout", "collective_error", "rendezvous", "connection_lost", "gpu_hardware",
            "host_oom", "platform_signal", "cuda_oom", "user_missing_module", "user_missing_file",
            "user_shape_error", "user_code_error"} <= categories


def test_every_shipped_rule_has_a_timeline_test():
    pack = load_rules()
    text = "\n".join(p.read_text() for p in TESTS)
    for rule in [*pack.responses, *pack.limits, *pack.detectors, *pack.diagnoses]:
        assert f"rule: {rule.name}" in text or f"reason: {rule.reason.value}" in text, rule.name


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_shipped_rule_tests_pass(path: Path):
    results = run_files([path])
    assert results and all(r.passed for r in results), [r for r in results if not r.passed]


def test_a_wrong_expectation_makes_a_rule_test_fail(tmp_path):
    test = tmp_path / "wrong.yaml"
    test.write_text(f"""
rule_files: {shipped_rules_dir()}
tests:
  - name: the hang comes a second later than it does
    args: --enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=10
    roles: {{worker: 1}}
    until: 15
    events:
      - {{at: 0, log: worker-0, text: started}}
    expect:
      - {{at: 11, action: restart_job, reason: job_hang}}
""")
    [result] = run_files([test])
    assert not result.passed
    assert any("expected at 11" in p for p in result.problems)
    assert any("unexpected decision at 10" in p for p in result.problems)


def test_an_expected_silence_fails_when_a_decision_happens(tmp_path):
    test = tmp_path / "silence.yaml"
    test.write_text(f"""
rule_files: {shipped_rules_dir()}
tests:
  - name: a crash is not silence
    args: --enable-job-restart=True
    events:
      - {{at: 1, exit: worker-0, code: 137}}
    expect: []
""")
    [result] = run_files([test])
    assert not result.passed and "unexpected decision at 1" in result.problems[0]


def test_rule_test_files_parse():
    for path in TESTS:
        assert parse_test_file(path).tests
