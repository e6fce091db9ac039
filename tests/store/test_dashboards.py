"""The Grafana dashboards: built from the product queries, structurally valid,
and every panel's SQL, expanded as Grafana and the ClickHouse plugin expand
it, runs on chDB against a seeded history and returns the panel's columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainwarden import dashboards
from trainwarden.store import SpoolWriter, analytics
from trainwarden.store.embedded import EmbeddedStore
from trainwarden.store.macros import ALL, TimeRange, expand_grafana, variables_used
from tests.history_seed import JOB_A, JOB_B, seed

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(dashboards.DASHBOARDS)


def _load(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / name).read_text("utf-8"))


def _panels():
    for name in FILES:
        for panel in _load(name)["panels"]:
            yield pytest.param(name, panel, id=f"{name}:{panel['id']}:{panel['title']}")


def _query_of(panel: dict) -> analytics.Query:
    sql = panel["targets"][0]["rawSql"]
    matches = [q for q in analytics.QUERIES if q.sql == sql]
    assert matches, f"panel {panel['title']!r} runs SQL that is not a product query of analytics.py"
    return matches[0]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dashboards") / "store"
    info = seed(SpoolWriter(directory))
    EmbeddedStore(directory).ingest()
    return directory, info


@pytest.mark.parametrize("name", FILES)
def test_the_committed_dashboard_is_exactly_what_the_product_queries_build(name):
    committed = (ROOT / "dashboards" / name).read_text("utf-8")
    assert committed == dashboards.render(dashboards.DASHBOARDS[name]), (
        f"dashboards/{name} is stale: run `.venv/bin/python -m trainwarden.dashboards`")


def test_dashboards_have_unique_uids_titles_and_unique_panel_ids_on_a_valid_grid():
    uids = [_load(name)["uid"] for name in FILES]
    assert len(set(uids)) == len(uids)
    for name in FILES:
        board = _load(name)
        assert board["title"].startswith("Trainwarden / ") and board["schemaVersion"] >= 36
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids) and all(isinstance(i, int) and i > 0 for i in ids), name
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
            assert {"type", "title", "datasource", "targets"} <= set(panel)


def test_every_panel_and_variable_uses_the_datasource_variable_of_the_provisioned_plugin():
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text())
    plugin = provisioned["datasources"][0]["type"]
    expected = {"type": plugin, "uid": "${datasource}"}
    for name in FILES:
        board = _load(name)
        chooser = board["templating"]["list"][0]
        assert chooser["name"] == "datasource" and chooser["type"] == "datasource", name
        assert chooser["pluginId"] == chooser["query"] == plugin
        assert [i["pluginId"] for i in board["__inputs"]] == [plugin]
        for panel in board["panels"]:
            assert panel["datasource"] == expected
            for target in panel["targets"]:
                assert target["datasource"] == expected and target["editorType"] == "sql"
                assert target["format"] in (dashboards.FORMAT_TABLE, dashboards.FORMAT_TIMESERIES)
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"] == expected


def test_the_dashboards_provider_reads_the_directory_the_compose_file_mounts():
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/trainwarden.yaml").read_text())
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../dashboards:{provider['providers'][0]['options']['path']}:ro" in mounts


@pytest.mark.parametrize("name", FILES)
def test_every_variable_a_panel_uses_is_defined_by_its_dashboard(name):
    board = _load(name)
    defined = {v["name"] for v in board["templating"]["list"]}
    for panel in board["panels"]:
        missing = variables_used(panel["targets"][0]["rawSql"]) - defined
        assert not missing, f"{panel['title']}: {missing}"


def test_drill_down_links_point_at_the_job_dashboard_with_the_clicked_value():
    links = [prop["value"][0]["url"] for name in FILES for panel in _load(name)["panels"]
             for override in panel["fieldConfig"]["overrides"] for prop in override["properties"]
             if prop["id"] == "links"]
    assert f"/d/{dashboards.JOB_UID}?var-job=${{__value.raw}}&${{__url_time_range}}" in links
    assert all("${__value.raw}" in url for url in links)
    job_uid = _load("job.json")["uid"]
    assert job_uid == dashboards.JOB_UID


def _grafana_values(board: dict, chosen: dict) -> dict:
    values = {}
    for variable in board["templating"]["list"]:
        name = variable["name"]
        if name in chosen:
            values[name] = chosen[name]
        elif variable["type"] == "constant":
            values[name] = variable["query"]
        elif variable.get("includeAll"):
            values[name] = variable["allValue"]
        else:
            values[name] = variable["current"]["value"] if "current" in variable else ""
    return values


@pytest.mark.parametrize("name,panel", list(_panels()))
def test_every_panel_sql_expanded_like_grafana_returns_its_columns_on_chdb(seeded, name, panel):
    directory, info = seeded
    board = _load(name)
    query = _query_of(panel)
    window = TimeRange(from_ms=int(info.start * 1000) - 60_000, to_ms=int(info.end * 1000) + 60_000,
                       interval_ms=300_000)
    values = _grafana_values(board, {"job": JOB_A} if name == "job.json" else {})
    expanded = expand_grafana(panel["targets"][0]["rawSql"], window, values)
    assert "$" not in expanded.replace("'$", "")  # nothing left for ClickHouse to choke on
    rows = EmbeddedStore(directory).select(expanded)
    assert rows, f"{panel['title']} returned nothing on the seeded history"
    assert tuple(rows[0]) == query.column_names


def test_a_time_range_before_the_history_leaves_time_filtered_panels_empty(seeded):
    directory, info = seeded
    before = TimeRange(from_ms=int(info.start * 1000) - 7_200_000, to_ms=int(info.start * 1000) - 3_600_000)
    all_values = {"job": ALL, "node": ALL, "source": ALL, "limit": "100"}
    store = EmbeddedStore(directory)
    for name in ("fault_details", "fault_list", "restarts_over_time", "worst_nodes", "diagnoses"):
        assert store.select(expand_grafana(analytics.BY_NAME[name].sql, before, all_values)) == [], name


def test_the_node_variable_narrows_the_aggregated_fault_details_to_that_node(seeded):
    directory, info = seeded
    window = TimeRange(int(info.start * 1000), int(info.end * 1000) + 1000)
    sql = analytics.BY_NAME["fault_details"].sql
    rows = EmbeddedStore(directory).select(expand_grafana(
        sql, window, {"job": ALL, "node": "gpu-node-2", "source": ALL, "limit": "100"}))
    assert rows and {r["node_name"] for r in rows} == {"gpu-node-2"}


def test_variable_queries_list_the_seeded_jobs_nodes_and_sources(seeded):
    directory, _ = seeded
    store = EmbeddedStore(directory)
    assert [r["job_id"] for r in store.select(analytics.VARIABLE_QUERIES["job"])] == sorted([JOB_A, JOB_B])
    assert [r["node_name"] for r in store.select(analytics.VARIABLE_QUERIES["node"])] == [
        "gpu-node-1", "gpu-node-2", "gpu-node-3"]
    assert {r["error_source"] for r in store.select(analytics.VARIABLE_QUERIES["source"])} == {
        "c4d", "hang", "instance_exit"}


def test_grafana_and_the_cli_get_the_same_answer_from_the_same_query(seeded):
    directory, info = seeded
    window = TimeRange(int(info.start * 1000), int(info.end * 1000) + 1000)
    store = EmbeddedStore(directory)
    for query in analytics.QUERIES:
        if "now64" in query.sql:
            continue  # a running job's wall time grows between the two calls
        grafana = store.select(expand_grafana(query.sql, window, {"job": JOB_A, "node": ALL, "source": ALL,
                                                                  "limit": "1000"}))
        with store._using() as sql:
            cli = analytics.run(sql, query.name, job=JOB_A, since=info.start, until=info.end + 1, limit=1000,
                                interval_s=60)
        assert [analytics.decode_row(query, row) for row in grafana] == cli, query.name
