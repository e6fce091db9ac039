"""Spot bids and market events in rule timeline tests (`trainwarden rules test`)."""

from __future__ import annotations

import pytest

from trainwarden.simulation.rule_tests import parse_test_file, run_files
from trainwarden.yamlsrc import ConfigError
from tests.conftest import ROOT

HEAD = f"rule_files: {ROOT / 'rules'}\ntests:\n  - name: t\n    roles: {{worker: 1}}\n"


def write(tmp_path, body: str):
    path = tmp_path / "spot_test.yaml"
    path.write_text(HEAD + body)
    return path


def test_a_requeue_expected_at_the_wrong_second_fails_the_timeline(tmp_path):
    path = write(tmp_path, """    spot: {on_demand: 1.0, discount: 0.5}
    events:
      - {at: 0, market: 0.3}
      - {at: 5, market: 0.9}
    expect:
      - {at: 6, action: requeue, reason: preempted}
""")
    [result] = run_files([path])
    assert not result.passed and "unexpected decision at 5: action=requeue" in "\n".join(result.problems)


def test_a_market_event_without_a_spot_bid_is_a_problem_naming_its_line(tmp_path):
    [result] = run_files([write(tmp_path, "    events:\n      - {at: 0, market: 0.3}\n")])
    assert not result.passed and "line 6: a market event needs the test's 'spot' bid" in result.problems


def test_a_spot_bid_with_both_limits_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of: discount, price_limit"):
        parse_test_file(write(tmp_path, "    spot: {on_demand: 1.0, discount: 0.5, price_limit: 0.4}\n"))


def test_a_spot_bid_discount_off_the_grid_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'discount' must be 0.1 to 0.9 in steps of 0.1, not 0.35"):
        parse_test_file(write(tmp_path, "    spot: {on_demand: 1.0, discount: 0.35}\n"))


def test_an_unknown_key_in_a_spot_bid_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'bid'"):
        parse_test_file(write(tmp_path, "    spot: {on_demand: 1.0, bid: 0.5}\n"))
