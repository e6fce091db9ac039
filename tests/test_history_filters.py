"""`trainwarden history --since/--node/--source` and `trainwarden store migrate`."""

from __future__ import annotations

import json
import time

from trainwarden.store import SpoolWriter, migrate
from tests.store.store_factories import fault

LATEST = max(m.version for m in migrate.load())


def _write(store):
    now = time.time()
    SpoolWriter(store).write([
        fault("old", job_id="j1", time=now - 3 * 86400, node_name="node-a", error_source="hang"),
        fault("new-a", job_id="j1", time=now - 600, node_name="node-a", error_source="instance_exit"),
        fault("new-b", job_id="j2", time=now - 300, node_name="node-b", error_source="instance_exit"),
    ])


def _ids(cli, *args):
    result = cli("history", "--json", "--wide", *args)
    assert result.code == 0, result
    return [row["record_id"] for row in json.loads(result.out)]


def test_since_a_duration_keeps_only_the_faults_inside_it(cli, store):
    _write(store)
    assert _ids(cli, "--since", "1h") == ["new-a", "new-b"]
    assert _ids(cli, "--since", "7d") == ["old", "new-a", "new-b"]


def test_since_a_utc_time_is_accepted(cli, store):
    _write(store)
    assert _ids(cli, "--since", "2000-01-01") == ["old", "new-a", "new-b"]
    assert _ids(cli, "--since", "2299-01-01T00:00") == []


def test_node_and_source_filters_combine_with_the_job_filter(cli, store):
    _write(store)
    assert _ids(cli, "--node", "node-a") == ["old", "new-a"]
    assert _ids(cli, "--source", "hang") == ["old"]
    assert _ids(cli, "--node", "node-a", "--source", "instance_exit", "--job", "j1") == ["new-a"]
    assert _ids(cli, "--node", "node-b", "--job", "j1") == []


def test_the_aggregate_takes_the_same_filters(cli, store):
    _write(store)
    result = cli("history", "--aggregate", "--json", "--since", "1h", "--node", "node-b")
    groups = json.loads(result.out)
    assert [(g["node_name"], g["count"], g["last_job"]) for g in groups] == [("node-b", 1, "j2")]


def test_a_bad_since_is_one_sentence_naming_the_flag(cli, store):
    result = cli("history", "--since", "yesterday")
    assert result.code == 2 and "--since" in result.err and "24h" in result.err and "Traceback" not in result.err


def test_an_unknown_source_is_a_usage_error_listing_the_sources(cli, store):
    result = cli("history", "--source", "gremlins")
    assert result.code == 2 and "instance_exit" in result.err


def test_filters_with_jobs_are_refused_rather_than_ignored(cli, store):
    result = cli("history", "--jobs", "--node", "node-a")
    assert result.code == 2 and "--jobs" in result.err


def test_store_migrate_brings_a_new_store_to_the_latest_version_then_has_nothing_to_do(cli, store):
    first = cli("store", "migrate", "--json")
    assert first.code == 0, first
    report = json.loads(first.out)
    assert report["version"] == LATEST and report["applied"] == [m.version for m in migrate.load()]
    again = cli("store", "migrate")
    assert again.code == 0 and "nothing to apply" in again.out and f"schema version {LATEST}" in again.out


def test_store_migrate_on_an_unreachable_server_is_one_sentence(cli, store):
    result = cli("store", "migrate", "--store", "http://default@127.0.0.1:9/trainwarden")
    assert result.code == 1 and "Traceback" not in result.err and "127.0.0.1:9" in result.err


def test_store_optimize_collapses_record_versions_and_keeps_every_record(cli, store):
    from trainwarden.store.embedded import EmbeddedStore
    from tests.store.store_factories import replace

    first = fault("r1", job_id="j1")
    SpoolWriter(store).write([first])
    EmbeddedStore(store).ingest()
    SpoolWriter(store).write([replace(first, result="done", updated_at=first.updated_at + 5), fault("r2")])
    EmbeddedStore(store).ingest()  # two inserts: two parts, the record's two versions in different ones
    assert EmbeddedStore(store).select("SELECT count() AS n FROM fault_records")[0]["n"] == 3  # versions
    result = cli("store", "optimize", "--json")
    assert result.code == 0, result
    assert "fault_records" in json.loads(result.out)["tables"]
    rows = EmbeddedStore(store).select("SELECT record_id, result FROM fault_records ORDER BY record_id")
    assert rows == [{"record_id": "r1", "result": "done"}, {"record_id": "r2", "result": "pending"}]
