"""Conformance of store/macros.py with the Grafana ClickHouse plugin at the
version the deployment pins.

The input/expected pairs are ported from the plugin's own unit tests,
github.com/grafana/clickhouse-datasource, pkg/macros/macros_test.go at tag
v4.18.0 (the times, intervals, macro calls and expected SQL are theirs; the
Go test calls the macro functions or sqlds.Interpolate, here each pair goes
through ``expand_grafana``). When the pin moves, port that tag's pairs here.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import yaml

from trainwarden import dashboards
from trainwarden.store import macros
from trainwarden.store.macros import TimeRange, expand_grafana

ROOT = Path(__file__).resolve().parents[2]
PINNED_TAG = "v4.18.0"
# The Go tests' time.Duration(20000000000): 20 s.
INTERVAL_MS = 20_000


def _ms(iso: str) -> int:
    # The Go tests' time.Parse("2006-01-02T15:04:05.000Z", ...).
    moment = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    return round(moment.timestamp() * 1000)


# TestMacroFromTimeFilter ... TestMacroDateTimeFilter share this range.
MACRO_RANGE = TimeRange(_ms("2014-11-12T11:45:26.371Z"), _ms("2015-11-12T11:45:26.371Z"), INTERVAL_MS)
# TestInterpolate's range.
INTERPOLATE_RANGE = TimeRange(_ms("2014-11-12T11:45:26.123Z"), _ms("2015-11-12T11:45:26.456Z"), INTERVAL_MS)


def test_the_pin_is_the_same_everywhere_the_plugin_is_named():
    version = dashboards.PLUGIN_VERSION
    assert PINNED_TAG == f"v{version}"
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    environment = compose["services"]["grafana"]["environment"]
    assert environment["GF_INSTALL_PLUGINS"] == f"{dashboards.PLUGIN_ID} {version}"
    assert environment["GF_PLUGINS_PREINSTALL"] == f"{dashboards.PLUGIN_ID}@{version}"
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text())
    assert provisioned["datasources"][0]["jsonData"]["version"] == version
    for name in dashboards.DASHBOARDS:
        board = json.loads((ROOT / "dashboards" / name).read_text("utf-8"))
        assert {"type": "datasource", "id": dashboards.PLUGIN_ID, "name": "ClickHouse",
                "version": version} in board["__requires"], name
        assert {t["pluginVersion"] for p in board["panels"] for t in p["targets"]} == {version}, name


# TestTimeToDate, TestTimeToDateTime, TestTimeToDateTime64: the literals every macro builds on.
def test_time_literals():
    assert macros._date(_ms("2014-11-12T11:45:26.371Z")) == "toDate('2014-11-12')"
    assert macros._datetime(1708430068 * 1000) == "toDateTime(1708430068)"
    assert macros._datetime64(1708430068123) == "fromUnixTimestamp64Milli(1708430068123)"


@pytest.mark.parametrize("call, expected", [
    # TestMacroFromTimeFilter, TestMacroToTimeFilter
    ("$__fromTime", "toDateTime(1415792726)"),
    ("$__toTime", "toDateTime(1447328726)"),
    # TestMacroFromTimeFilterMs, TestMacroToTimeFilterMs
    ("$__fromTime_ms", "fromUnixTimestamp64Milli(1415792726371)"),
    ("$__toTime_ms", "fromUnixTimestamp64Milli(1447328726371)"),
    # TestMacroDateFilter
    ("$__dateFilter(dateCol)", "dateCol >= toDate('2014-11-12') AND dateCol <= toDate('2015-11-12')"),
    # TestMacroDateTimeFilter ($__dt is the same function in the plugin's macro map)
    ("$__dateTimeFilter(dateCol, timeCol)",
     "(dateCol >= toDate('2014-11-12') AND dateCol <= toDate('2015-11-12')) AND "
     "(timeCol >= toDateTime(1415792726) AND timeCol <= toDateTime(1447328726))"),
    ("$__dt(dateCol, timeCol)",
     "(dateCol >= toDate('2014-11-12') AND dateCol <= toDate('2015-11-12')) AND "
     "(timeCol >= toDateTime(1415792726) AND timeCol <= toDateTime(1447328726))"),
    # TestMacroTimeInterval, TestMacroTimeIntervalMs, TestMacroIntervalSeconds
    ("$__timeInterval(col)", "toStartOfInterval(toDateTime(col), INTERVAL 20 second)"),
    ("$__timeInterval_ms(col)", "toStartOfInterval(toDateTime64(col, 3), INTERVAL 20000 millisecond)"),
    ("$__interval_s", "20"),
])
def test_each_macro_expands_to_the_plugins_expected_text(call, expected):
    assert expand_grafana(call, MACRO_RANGE, {}) == expected


# TestInterpolate: whole statements through sqlds.Interpolate with the plugin's macros.
@pytest.mark.parametrize("name, statement, expected", [
    ("clickhouse timeFilter",
     "select * from foo where $__timeFilter(cast(sth as timestamp))",
     "select * from foo where cast(sth as timestamp) >= toDateTime(1415792726) AND "
     "cast(sth as timestamp) <= toDateTime(1447328726)"),
    ("clickhouse timeFilter with empty spaces",
     "select * from foo where $__timeFilter(cast(sth as timestamp) )",
     "select * from foo where cast(sth as timestamp) >= toDateTime(1415792726) AND "
     "cast(sth as timestamp) <= toDateTime(1447328726)"),
    ("clickhouse timeFilter_ms",
     "select * from foo where $__timeFilter_ms(cast(sth as timestamp))",
     "select * from foo where cast(sth as timestamp) >= fromUnixTimestamp64Milli(1415792726123) AND "
     "cast(sth as timestamp) <= fromUnixTimestamp64Milli(1447328726456)"),
    ("clickhouse timeFilter_ms with empty spaces",
     "select * from foo where $__timeFilter_ms(cast(sth as timestamp) )",
     "select * from foo where cast(sth as timestamp) >= fromUnixTimestamp64Milli(1415792726123) AND "
     "cast(sth as timestamp) <= fromUnixTimestamp64Milli(1447328726456)"),
    ("clickhouse fromTime and toTime",
     "select * from foo where ( date >= $__fromTime and date <= $__toTime ) limit 100",
     "select * from foo where ( date >= toDateTime(1415792726) and date <= toDateTime(1447328726) ) limit 100"),
    ("clickhouse fromTime and toTime inside a complex clauses",
     "select * from foo where ( date >= $__fromTime ) and ( date <= $__toTime ) limit 100",
     "select * from foo where ( date >= toDateTime(1415792726) ) and ( date <= toDateTime(1447328726) ) limit 100"),
    ("clickhouse fromTime_ms and toTime_ms",
     "select * from foo where ( date >= $__fromTime_ms and date <= $__toTime_ms ) limit 100",
     "select * from foo where ( date >= fromUnixTimestamp64Milli(1415792726123) and "
     "date <= fromUnixTimestamp64Milli(1447328726456) ) limit 100"),
    ("clickhouse fromTime_ms and toTime_ms inside a complex clauses",
     "select * from foo where ( date >= $__fromTime_ms ) and ( date <= $__toTime_ms ) limit 100",
     "select * from foo where ( date >= fromUnixTimestamp64Milli(1415792726123) ) and "
     "( date <= fromUnixTimestamp64Milli(1447328726456) ) limit 100"),
])
def test_statements_interpolate_as_the_plugin_interpolates_them(name, statement, expected):
    assert expand_grafana(statement, INTERPOLATE_RANGE, {}) == expected, name
