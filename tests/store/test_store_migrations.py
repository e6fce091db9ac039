"""The schema is applied by versioned, idempotent migrations and matches records.py."""

from __future__ import annotations

import json

import pytest

from trainwarden.store import migrate, queries
from trainwarden.store.embedded import EmbeddedStore
from trainwarden.store.schema import BY_NAME, TABLES, clickhouse_rows
from tests.store.store_factories import fault

LATEST = max(m.version for m in migrate.load())
ALL = [m.version for m in migrate.load()]
FAULTS = BY_NAME["fault_records"]


def test_a_new_store_is_at_the_latest_version_and_schema_migrations_lists_every_one(store_dir):
    store = EmbeddedStore(store_dir)
    assert store.current_version() == LATEST
    rows = store.select("SELECT version, toUnixTimestamp64Milli(applied_at) AS ms FROM schema_migrations "
                        "ORDER BY version")
    assert [r["version"] for r in rows] == ALL and rows[0]["ms"] > 0


def test_opening_again_and_applying_again_change_nothing(store_dir):
    EmbeddedStore(store_dir).faults()
    store = EmbeddedStore(store_dir)
    store.faults()
    with store._using() as sql:
        assert migrate.apply(sql) == []
        assert migrate.applied_versions(sql) == ALL
    assert store.select("SELECT count() AS n FROM schema_migrations")[0]["n"] == len(ALL)


def test_a_statement_interrupted_migration_is_completed_by_running_it_again(store_dir):
    with EmbeddedStore(store_dir)._using() as sql:
        sql.execute("DROP TABLE dead_letters")
        sql.execute("TRUNCATE TABLE schema_migrations")
        assert migrate.current_version(sql) == 0
        assert migrate.apply(sql) == ALL
        assert migrate.current_version(sql) == LATEST
    assert EmbeddedStore(store_dir).dead_letters() == []


def test_pending_migrations_are_applied_in_version_order(store_dir, tmp_path):
    directory = tmp_path / "migrations"
    directory.mkdir()
    (directory / "0001_initial.sql").write_text((migrate.MIGRATIONS_DIR / "0001_initial.sql").read_text())
    (directory / "0003_index.sql").write_text(
        "ALTER TABLE fault_records ADD INDEX IF NOT EXISTS by_category category TYPE set(100) GRANULARITY 4;\n")
    (directory / "0002_note.sql").write_text("-- a comment;\nALTER TABLE jobs ADD COLUMN IF NOT EXISTS note String;\n")
    with EmbeddedStore(store_dir)._using() as sql:
        sql.execute("TRUNCATE TABLE schema_migrations")
        assert migrate.apply(sql, migrate.load(directory)[:1]) == [1]
        assert migrate.apply(sql, migrate.load(directory)) == [2, 3]
        assert migrate.applied_versions(sql) == [1, 2, 3]
        assert "note" in [r["name"] for r in sql.select("DESCRIBE TABLE jobs")]
        assert migrate.apply(sql, migrate.load(directory)) == []


def test_migration_files_must_be_numbered_and_unique(tmp_path):
    (tmp_path / "initial.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="NNNN_name.sql"):
        migrate.load(tmp_path)
    (tmp_path / "initial.sql").unlink()
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 2;")
    with pytest.raises(ValueError, match="share version 1"):
        migrate.load(tmp_path)


def test_statements_split_at_semicolons_ending_a_line_and_comments_are_dropped():
    text = "-- header; with a semicolon;\nCREATE TABLE a\n(\n  x String -- 'a;b'\n);\n\nSELECT ';' ;  \nSELECT 3"
    assert migrate.split_statements(text) == ["CREATE TABLE a\n(\n  x String -- 'a;b'\n)", "SELECT ';'", "SELECT 3"]


def test_the_first_shipped_migration_is_five_idempotent_create_statements():
    initial = migrate.load()[0]
    assert initial.version == 1
    assert [s.split("(")[0].split()[-1] for s in initial.statements] == [
        "schema_migrations", "fault_records", "restart_stages", "jobs", "dead_letters"]
    assert all(s.startswith("CREATE TABLE IF NOT EXISTS") for s in initial.statements)


def test_every_table_has_the_columns_of_its_record_in_order_with_the_intended_types(store_dir):
    store = EmbeddedStore(store_dir)
    low_cardinality = {"error_source", "action", "result", "reason", "category", "status"}
    for table in TABLES:
        described = {r["name"]: r["type"] for r in store.select(f"DESCRIBE TABLE {table.name}")}
        assert tuple(described) == table.columns
        for column, kind in described.items():
            if column in table.times:
                assert kind == "DateTime64(3, 'UTC')", column
            elif column in low_cardinality:
                assert kind == "LowCardinality(String)", column
        for column in table.ints:
            expected = {"error_code": "Int32", "rank": "Int32", "http_status": "UInt16"}.get(column, "UInt32")
            assert described[column] == expected, column
        for column in table.floats:
            assert described[column] == "Float64"


def test_the_tables_collapse_versions_by_the_intended_keys(store_dir):
    store = EmbeddedStore(store_dir)
    engines = {r["name"]: (r["engine_full"], r["sorting_key"]) for r in store.select(
        "SELECT name, engine_full, sorting_key FROM system.tables WHERE database = currentDatabase()")}
    assert engines["fault_records"][1] == "job_id, record_id"
    assert "ReplacingMergeTree(updated_at)" in engines["fault_records"][0]
    assert "PARTITION BY toYYYYMM(time)" in engines["fault_records"][0]
    assert engines["restart_stages"][1] == "job_id, record_id, instance_name"
    assert engines["jobs"][1] == "job_id"
    assert engines["dead_letters"][1] == "time, source, job_id, error, payload"
    for table in TABLES:
        assert "fsync_after_insert = 1" in engines[table.name][0], table.name
    store.write([fault()])  # the direct path works too
    assert len(store.faults()) == 1


def test_version_4_adds_node_events_by_node_and_the_indexes_the_dashboards_filter_on(store_dir):
    store = EmbeddedStore(store_dir)
    tables = {r["name"]: r for r in store.select(
        "SELECT name, sorting_key, partition_key FROM system.tables WHERE database = currentDatabase()")}
    assert tables["node_events"]["sorting_key"] == "node_name, event_id"
    assert tables["node_events"]["partition_key"] == "toYYYYMM(time)"
    indexes = {(r["table"], r["name"]): r["type"] for r in store.select(
        "SELECT table, name, type FROM system.data_skipping_indices WHERE database = currentDatabase()")}
    assert indexes[("fault_records", "idx_time")] == "minmax"
    assert indexes[("fault_records", "idx_node")] == "bloom_filter"
    assert indexes[("fault_records", "idx_source")] == "set"
    assert indexes[("restart_stages", "idx_detected")] == "minmax"
    types = {r["name"]: r["type"] for r in store.select("DESCRIBE TABLE fault_records")}
    assert {types[c] for c in ("node_name", "instance_name", "error_signature")} == {"LowCardinality(String)"}


def _at_version(sql, tmp_path, version: int, tables: tuple[str, ...] = ("fault_records",)) -> None:
    """The store as a Trainwarden of that schema version left it (``tables`` made again)."""
    directory = tmp_path / f"v{version}"
    directory.mkdir()
    for migration in migrate.MIGRATIONS_DIR.glob("*.sql"):
        if int(migration.name[:4]) <= version:
            (directory / migration.name).write_text(migration.read_text())
    for table in tables:
        sql.execute(f"DROP TABLE {table}")
    sql.execute("TRUNCATE TABLE schema_migrations")
    assert migrate.apply(sql, migrate.load(directory)) == list(range(1, version + 1))


def _insert_old_faults(sql, records, *later_columns: str) -> None:
    """Fault records as a store without the later versions' columns held them."""
    rows = [json.loads(line) for line in clickhouse_rows(FAULTS, records).splitlines()]
    for row in rows:
        for column in later_columns:
            row.pop(column)
    sql.insert("INSERT INTO fault_records FORMAT JSONEachRow", b"".join(json.dumps(r).encode() + b"\n" for r in rows))


def test_version_4_keeps_the_records_of_a_version_3_store(store_dir, tmp_path):
    with EmbeddedStore(store_dir)._using() as sql:
        _at_version(sql, tmp_path, 3, ("fault_records", "node_events"))
        _insert_old_faults(sql, [fault("r1", node_name="node-a"), fault("r2", node_name="node-b")],
                           "verdict", "consequences", "evidence")
        assert migrate.apply(sql)[0] == 4  # and any later ones
        assert [(r["record_id"], r["node_name"]) for r in queries.faults(sql)] == [("r1", "node-a"),
                                                                                  ("r2", "node-b")]


def test_version_7_keeps_the_fault_records_of_a_version_6_store_and_reads_their_evidence_as_empty(store_dir,
                                                                                                   tmp_path):
    with EmbeddedStore(store_dir)._using() as sql:
        _at_version(sql, tmp_path, 6)
        _insert_old_faults(sql, [fault("r1", verdict="retryable")], "evidence")
        assert migrate.apply(sql)[0] == 7
        queries.insert_records(sql, [fault("r2", time=fault().time + 1, evidence="phase: training (lines)")])
        assert [(r["record_id"], r["verdict"], r["evidence"]) for r in queries.faults(sql)] == [
            ("r1", "retryable", ""), ("r2", "", "phase: training (lines)")]
