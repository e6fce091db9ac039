"""The macro expander does what Grafana and the ClickHouse plugin do, and
the CLI's parameter form never puts a value into SQL text."""

from __future__ import annotations

import pytest

from trainwarden.store.macros import MacroError, TimeRange, expand_grafana, interpolate, to_parameters

RANGE = TimeRange(from_ms=1_415_792_726_123, to_ms=1_447_328_726_999, interval_ms=20_000)


def test_time_filter_is_whole_seconds_as_the_plugin_writes_it():
    assert expand_grafana("WHERE $__timeFilter(time)", RANGE, {}) == (
        "WHERE time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)")


def test_time_filter_ms_keeps_milliseconds():
    assert expand_grafana("$__timeFilter_ms(t)", RANGE, {}) == (
        "t >= fromUnixTimestamp64Milli(1415792726123) AND t <= fromUnixTimestamp64Milli(1447328726999)")


def test_from_and_to_macros_without_parentheses():
    assert expand_grafana("$__fromTime, $__toTime, $__fromTime_ms, $__toTime_ms", RANGE, {}) == (
        "toDateTime(1415792726), toDateTime(1447328726), fromUnixTimestamp64Milli(1415792726123), "
        "fromUnixTimestamp64Milli(1447328726999)")


def test_time_interval_and_interval_seconds_use_the_panel_interval_at_least_one_second():
    assert expand_grafana("$__timeInterval(time) / $__interval_s", RANGE, {}) == (
        "toStartOfInterval(toDateTime(time), INTERVAL 20 second) / 20")
    small = TimeRange(0, 1000, interval_ms=50)
    assert expand_grafana("$__interval_s", small, {}) == "1"
    assert expand_grafana("$__timeInterval_ms(t)", small, {}) == (
        "toStartOfInterval(toDateTime64(t, 3), INTERVAL 50 millisecond)")


def test_a_macro_argument_may_contain_parentheses():
    assert expand_grafana("$__timeFilter(toDateTime(x))", RANGE, {}).startswith(
        "toDateTime(x) >= toDateTime(1415792726)")


def test_sqlstring_quotes_and_doubles_single_quotes_like_grafana():
    assert interpolate("job_id = ${job:sqlstring}", {"job": "o'brien"}) == "job_id = 'o''brien'"
    assert interpolate("x IN (${node:sqlstring})", {"node": ["a", "b"]}) == "x IN ('a','b')"
    assert interpolate("$job and [[job]] and ${job}", {"job": "j1"}) == "j1 and j1 and j1"


def test_grafana_built_ins_and_unknown_variables_are_left_alone():
    assert interpolate("$__interval ${other}", {"job": "x"}) == "$__interval ${other}"


def test_an_unknown_macro_is_an_error_not_text_sent_to_clickhouse():
    with pytest.raises(MacroError, match="unknown macro"):
        expand_grafana("$__timeFliter(time)", RANGE, {})


def test_a_macro_with_the_wrong_number_of_arguments_is_an_error():
    with pytest.raises(MacroError, match="expects 1 argument"):
        expand_grafana("$__timeFilter(a, b)", RANGE, {})


def test_a_missing_variable_value_is_an_error():
    with pytest.raises(MacroError, match="no value"):
        expand_grafana("${job:sqlstring}", RANGE, {})


def test_parameter_form_turns_variables_and_macros_into_typed_parameters():
    assert to_parameters("job_id = ${job:sqlstring} AND $__timeFilter_ms(time) LIMIT ${limit}") == (
        "job_id = {job:String} AND time >= fromUnixTimestamp64Milli({__from_ms:Int64})"
        " AND time <= fromUnixTimestamp64Milli({__to_ms:Int64}) LIMIT {limit:UInt64}")


def test_parameter_form_refuses_an_unquoted_string_variable():
    with pytest.raises(MacroError, match=r"\$\{job:sqlstring\}"):
        to_parameters("job_id = '${job}'")


def test_parameter_form_refuses_an_unknown_variable():
    with pytest.raises(MacroError, match="unknown variable"):
        to_parameters("x = ${cluster:sqlstring}")
