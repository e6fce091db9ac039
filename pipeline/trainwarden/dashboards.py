"""The Grafana dashboards (dashboards/*.json), built from the product queries.

Every panel's SQL is a query of ``store/analytics.py``, embedded verbatim, so
the dashboards and ``trainwarden history``/``report`` cannot drift apart:
``python -m trainwarden.dashboards`` rewrites the files, and a test fails when
the committed files differ from what this module builds.

Data source: every panel and variable names ``${datasource}``, a data-source
variable over the grafana-clickhouse-datasource plugin, never a uid: the
files import into any Grafana (file provisioning picks the default ClickHouse
data source, deploy/grafana/provisioning/; an import through the UI asks for
one, ``__inputs``). The macros follow one plugin version, ``PLUGIN_VERSION``,
pinned wherever the plugin is installed (deploy/docker-compose.yml) and
checked against the plugin's own tests (tests/store/test_plugin_macros.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainwarden.store.analytics import BY_NAME, VARIABLE_QUERIES
from trainwarden.store.macros import ALL

PLUGIN_ID = "grafana-clickhouse-datasource"
PLUGIN_VERSION = "4.18.0"  # the last release before macropro (4.19.0), which store/macros.py follows
# Grafana's floor for that version of the plugin (its src/plugin.json).
GRAFANA_DEPENDENCY = "11.6.0"
DATASOURCE_VARIABLE = "datasource"
DATASOURCE_INPUT = "DS_CLICKHOUSE"
DATASOURCE = {"type": PLUGIN_ID, "uid": "${%s}" % DATASOURCE_VARIABLE}
DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"
SCHEMA_VERSION = 39
FORMAT_TIMESERIES, FORMAT_TABLE = 0, 1
JOB_UID = "trainwarden-job"
FAULTS_UID = "trainwarden-faults"
LIMIT_DEFAULT = "1000"


def _variable(name: str, label: str, include_all: bool = True) -> dict:
    variable = {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": VARIABLE_QUERIES[name], "definition": VARIABLE_QUERIES[name],
        "refresh": 2, "sort": 1, "multi": False, "includeAll": include_all, "options": [],
    }
    if include_all:
        variable["allValue"] = ALL
        variable["current"] = {"selected": True, "text": "All", "value": "$__all"}
    return variable


def _datasource_variable() -> dict:
    # Its value is the import input's: a UI import substitutes the chosen data
    # source; provisioned from a file it matches none, and Grafana takes the
    # default ClickHouse data source.
    chosen = "${%s}" % DATASOURCE_INPUT
    return {
        "name": DATASOURCE_VARIABLE, "label": "Data source", "type": "datasource", "query": PLUGIN_ID,
        "pluginId": PLUGIN_ID, "regex": "", "refresh": 1, "hide": 0, "multi": False, "includeAll": False,
        "current": {"selected": False, "text": chosen, "value": chosen}, "options": [],
    }


def _limit_variable() -> dict:
    options = ["100", "1000", "10000"]
    return {
        "name": "limit", "label": "Rows", "type": "custom", "query": ",".join(options), "multi": False,
        "includeAll": False, "current": {"selected": True, "text": LIMIT_DEFAULT, "value": LIMIT_DEFAULT},
        "options": [{"selected": o == LIMIT_DEFAULT, "text": o, "value": o} for o in options],
    }


def _link(title: str, uid: str, variable: str) -> list[dict]:
    return [{"title": title, "url": f"/d/{uid}?var-{variable}=${{__value.raw}}&${{__url_time_range}}"}]


class _Layout:
    """Panels left to right, wrapping at Grafana's 24 columns; ids in order."""

    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = self.row_height = 0

    def add(self, kind: str, query: str, w: int, h: int, fmt: int = FORMAT_TABLE, title: str | None = None,
            unit: str = "", links: dict[str, list[dict]] | None = None, options: dict | None = None,
            reduce_fields: str = "") -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        q = BY_NAME[query]
        defaults: dict = {}
        if unit:
            defaults["unit"] = unit
        overrides = [{"matcher": {"id": "byName", "options": column},
                      "properties": [{"id": "links", "value": value}]}
                     for column, value in sorted((links or {}).items())]
        panel = {
            "id": len(self.panels) + 1, "type": kind, "title": title or q.title,
            "description": f"Query: {q.name} (pipeline/trainwarden/store/analytics.py); columns: {', '.join(q.column_names)}",
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "datasource": DATASOURCE,
            "fieldConfig": {"defaults": defaults, "overrides": overrides},
            "options": dict(options or {}),
            "targets": [{
                "refId": "A", "datasource": DATASOURCE, "editorType": "sql", "pluginVersion": PLUGIN_VERSION,
                "queryType": "timeseries" if fmt == FORMAT_TIMESERIES else "table", "format": fmt,
                "rawSql": q.sql,
            }],
        }
        if reduce_fields:
            panel["options"].setdefault("reduceOptions", {"calcs": ["lastNotNull"], "fields": reduce_fields,
                                                          "values": False})
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def _dashboard(uid: str, title: str, description: str, layout: _Layout, variables: list[dict]) -> dict:
    return {
        "__inputs": [{"name": DATASOURCE_INPUT, "label": "ClickHouse", "description": "the Trainwarden history",
                      "type": "datasource", "pluginId": PLUGIN_ID, "pluginName": "ClickHouse"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_DEPENDENCY},
            {"type": "datasource", "id": PLUGIN_ID, "name": "ClickHouse", "version": PLUGIN_VERSION},
        ],
        "uid": uid, "title": title, "description": description, "tags": ["trainwarden"],
        "timezone": "utc", "editable": False, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "refresh": "1m", "time": {"from": "now-7d", "to": "now"},
        "annotations": {"list": []},
        "links": [{"title": "Trainwarden", "type": "dashboards", "tags": ["trainwarden"], "asDropdown": True}],
        "templating": {"list": [_datasource_variable()] + variables + [_limit_variable()]},
        "panels": layout.panels,
    }


def overview() -> dict:
    layout = _Layout()
    layout.add("timeseries", "restarts_over_time", 12, 8, FORMAT_TIMESERIES)
    layout.add("timeseries", "faults_by_source_over_time", 12, 8, FORMAT_TIMESERIES)
    layout.add("stat", "mtbf_mttr", 8, 6, unit="s", reduce_fields="/^(mtbf_s|mttr_s)$/")
    layout.add("piechart", "goodput", 8, 6, title="Where the time went", unit="s",
               reduce_fields="/_s$/", options={"pieType": "donut", "legend": {"displayMode": "table",
                                                                                "placement": "right"}})
    layout.add("stat", "goodput", 8, 6, title="Goodput (running / wall time)", unit="percentunit",
               reduce_fields="/^goodput$/")
    layout.add("table", "worst_nodes", 12, 9, links={"node_name": _link("Faults of this node", FAULTS_UID, "node")})
    layout.add("table", "jobs", 12, 9, links={"job_id": _link("Job detail", JOB_UID, "job")})
    layout.add("table", "node_events", 24, 7)
    layout.add("table", "spot_costs", 24, 7, links={"job_id": _link("Job detail", JOB_UID, "job")})
    return _dashboard("trainwarden-overview", "Trainwarden / Overview",
                      "Restarts and faults over time, MTBF/MTTR, goodput, worst nodes, spot costs.", layout,
                      [_variable("job", "Job"), _variable("node", "Node"), _variable("source", "Source")])


def faults() -> dict:
    layout = _Layout()
    layout.add("table", "fault_details", 24, 12,
               links={"last_job": _link("Job detail", JOB_UID, "job"),
                      "node_name": _link("Only this node", FAULTS_UID, "node")})
    layout.add("bargauge", "faults_by_source", 8, 8, reduce_fields="/^faults$/",
               options={"displayMode": "basic", "orientation": "horizontal"})
    layout.add("table", "fault_list", 16, 8, links={"job_id": _link("Job detail", JOB_UID, "job")})
    return _dashboard(FAULTS_UID, "Trainwarden / Aggregated fault details",
                      "Fault records grouped by source, code, normalised message, node and instance, "
                      "with counts and first/last seen; drill down to a job.", layout,
                      [_variable("job", "Job"), _variable("node", "Node"), _variable("source", "Source")])


def job() -> dict:
    layout = _Layout()
    layout.add("state-timeline", "job_timeline", 24, 5, FORMAT_TABLE,
               options={"showValue": "auto", "mergeValues": True, "rowHeight": 0.8})
    layout.add("table", "job_rounds", 16, 8, unit="s")
    layout.add("piechart", "goodput", 8, 8, title="Where the time went", unit="s", reduce_fields="/_s$/",
               options={"pieType": "donut"})
    layout.add("table", "fault_list", 24, 9)
    layout.add("table", "stack_suspects", 16, 7)
    layout.add("bargauge", "faults_by_source", 8, 7, reduce_fields="/^faults$/",
               options={"displayMode": "basic", "orientation": "horizontal"})
    layout.add("table", "spot_costs", 24, 4, title="Spot: cost against on-demand")
    return _dashboard(JOB_UID, "Trainwarden / Job detail",
                      "One job: its rounds as a timeline of stages, fault records, stack-report suspects. "
                      "Panels of this dashboard are scoped by the job, not by the time range (except "
                      "fault records, goodput and suspects).", layout,
                      [_variable("job", "Job", include_all=False),
                       _constant_all("node"), _constant_all("source")])


def diagnosis() -> dict:
    layout = _Layout()
    layout.add("table", "diagnoses_by_kind", 12, 8)
    layout.add("table", "hang_advice", 12, 8)
    layout.add("table", "diagnoses", 24, 10, links={"job_id": _link("Job detail", JOB_UID, "job")})
    layout.add("table", "stack_suspects", 24, 8, links={"job_id": _link("Job detail", JOB_UID, "job")})
    return _dashboard("trainwarden-diagnosis", "Trainwarden / Diagnosis",
                      "C4D findings, hang-interval advice and stack-report suspects.", layout,
                      [_variable("job", "Job"), _variable("node", "Node")])


def _constant_all(name: str) -> dict:
    # A hidden variable: the job dashboard's shared queries filter by it, always "all".
    return {"name": name, "type": "constant", "hide": 2, "query": ALL}


DASHBOARDS = {"overview.json": overview, "faults.json": faults, "job.json": job, "diagnosis.json": diagnosis}


def render(build) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    target = Path((argv or sys.argv[1:] or [str(DASHBOARDS_DIR)])[0])
    target.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (target / name).write_text(render(build), encoding="utf-8")
        print(f"wrote {target / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
