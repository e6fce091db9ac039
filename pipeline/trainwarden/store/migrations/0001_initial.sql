-- Trainwarden history, version 1.
--
-- Table names are unqualified: the migration runner (pipeline/trainwarden/store/migrate.py)
-- creates the database (`trainwarden` unless a server URL names another) and
-- runs these statements inside it. By hand on a server:
--   clickhouse-client -q 'CREATE DATABASE IF NOT EXISTS trainwarden'
--   clickhouse-client -d trainwarden --multiquery < 0001_initial.sql
--
-- Records are written more than once (a decision is stored as `pending` and
-- again when done) and a spool segment may be ingested twice after a crash,
-- so every table is a ReplacingMergeTree and every query reads with FINAL.
--
-- fsync on insert: the embedded store deletes a spool segment right after
-- inserting it, so by then the rows must be on disk, not in the page cache.
-- (Inserts are small and rare; the cost is a few milliseconds.)
--
-- No TTL: keeping the history is the point of this store, and how long to
-- keep it is a site decision, e.g.
--   ALTER TABLE fault_records MODIFY TTL toDateTime(time) + INTERVAL 1 YEAR;

CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    applied_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY version;

-- A record keeps its detection `time` across versions, so monthly partitions
-- never separate the versions that FINAL has to collapse.
CREATE TABLE IF NOT EXISTS fault_records
(
    record_id String,
    job_id String,
    time DateTime64(3, 'UTC'),
    round UInt32,
    node_name String,
    instance_name String,
    error_code Int32,
    error_message String,
    error_source LowCardinality(String),
    action LowCardinality(String),
    result LowCardinality(String),
    duration_s Float64,
    reason LowCardinality(String),
    rule LowCardinality(String),
    classifier LowCardinality(String),
    category LowCardinality(String),
    error_signature String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
PARTITION BY toYYYYMM(time)
ORDER BY (job_id, record_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;

-- instance_name is part of the key so that one restart decision that touches
-- several instances keeps one row per instance.
CREATE TABLE IF NOT EXISTS restart_stages
(
    record_id String,
    job_id String,
    round UInt32,
    instance_name String,
    detected_at DateTime64(3, 'UTC'),
    decided_at DateTime64(3, 'UTC'),
    stopped_at DateTime64(3, 'UTC'),
    restarted_at DateTime64(3, 'UTC'),
    running_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (job_id, record_id, instance_name)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;

CREATE TABLE IF NOT EXISTS jobs
(
    job_id String,
    submitted_at DateTime64(3, 'UTC'),
    finished_at DateTime64(3, 'UTC'),
    status LowCardinality(String),
    reason LowCardinality(String),
    framework LowCardinality(String),
    args String,
    instances UInt32,
    rounds UInt32,
    node_name String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY job_id
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;

-- A dead letter has no id of its own: the whole row is the key, so the same
-- letter ingested twice is one row while two different letters in the same
-- millisecond stay two.
CREATE TABLE IF NOT EXISTS dead_letters
(
    time DateTime64(3, 'UTC'),
    source LowCardinality(String),
    job_id String,
    error String,
    payload String
)
ENGINE = ReplacingMergeTree
ORDER BY (time, source, job_id, error, payload)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;
