"""Every dashboard in dashboards/ imports into any Grafana: data sources are
chosen through a data-source variable and an import input (``__inputs``),
never a uid of this deployment. Whatever the data source, ClickHouse or
Prometheus (services.json); only ClickHouse dashboards have their SQL macros
checked, Prometheus queries have none."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from trainwarden import dashboards
from trainwarden.store.macros import TimeRange, expand_grafana

ROOT = Path(__file__).resolve().parent.parent
BOARDS = sorted((ROOT / "dashboards").glob("*.json"))
# Grafana's own annotation source is not a data source a site provides.
BUILT_IN = {"-- Grafana --", "grafana"}
REFERENCE = re.compile(r"^\$\{(\w+)\}$")


def _load(path: Path) -> dict:
    return json.loads(path.read_text("utf-8"))


def _datasource_refs(node, where: str = ""):
    """Every data-source reference in a dashboard, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and value is not None:
                yield f"{where}/{key}", value
            else:
                yield from _datasource_refs(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _datasource_refs(value, f"{where}/{index}")


def _chooser_plugins(board: dict) -> dict[str, str]:
    return {v["name"]: v.get("pluginId") or v.get("query") for v in board.get("templating", {}).get("list", [])
            if v.get("type") == "datasource"}


def _plugin(board: dict) -> str:
    plugins = set(_chooser_plugins(board).values())
    assert len(plugins) == 1, plugins
    return plugins.pop()


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_every_data_source_reference_is_the_dashboards_datasource_variable(path):
    board = _load(path)
    choosers = _chooser_plugins(board)
    assert choosers, f"{path.name} has no data-source variable"
    refs = list(_datasource_refs(board))
    assert refs, path.name
    for where, ref in refs:
        uid = ref.get("uid") if isinstance(ref, dict) else ref
        if uid in BUILT_IN:
            continue
        found = REFERENCE.match(str(uid))
        assert found and found.group(1) in choosers, f"{path.name}{where}: a hard-coded data source {ref!r}"
        if isinstance(ref, dict) and "type" in ref:
            assert ref["type"] == choosers[found.group(1)], f"{path.name}{where}"


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_a_ui_import_binds_every_input_and_leaves_no_uid_of_this_deployment(path):
    board = _load(path)
    inputs = board.get("__inputs", [])
    plugins = set(_chooser_plugins(board).values())
    assert {i["pluginId"] for i in inputs if i["type"] == "datasource"} == plugins, path.name
    # What Grafana's import does: each ${INPUT} becomes the data source the user chose.
    text = path.read_text("utf-8")
    for item in inputs:
        text = text.replace("${%s}" % item["name"], "uid-chosen-at-import")
    imported = json.loads(text)
    assert "${DS_" not in text
    chooser = next(v for v in imported["templating"]["list"] if v.get("type") == "datasource")
    assert chooser["current"]["value"] == "uid-chosen-at-import"
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text())
    for source in provisioned["datasources"]:
        assert source["uid"] not in text, f"{path.name} names this deployment's data source {source['uid']!r}"


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_the_sql_of_every_clickhouse_dashboard_expands_with_the_pinned_plugins_macros(path):
    board = _load(path)
    if _plugin(board) != dashboards.PLUGIN_ID:
        pytest.skip(f"{path.name} queries {_plugin(board)}: no SQL macros to expand")
    values = {v["name"]: v.get("allValue") or v.get("query") or "" for v in board["templating"]["list"]}
    window = TimeRange(0, 3_600_000, 60_000)
    sqls = [t["rawSql"] for p in board["panels"] for t in p.get("targets", []) if "rawSql" in t]
    assert sqls, path.name
    for sql in sqls:
        expanded = expand_grafana(sql, window, values)
        assert "$__" not in expanded and "${" not in expanded, sql
