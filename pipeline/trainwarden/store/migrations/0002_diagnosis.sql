-- Trainwarden history, version 2: stack reports of hung jobs and findings of
-- diagnostic sources (C4D, hang-interval advice).

CREATE TABLE IF NOT EXISTS stack_reports
(
    report_id String,
    record_id String,
    job_id String,
    time DateTime64(3, 'UTC'),
    round UInt32,
    tool LowCardinality(String),
    processes UInt32,
    groups UInt32,
    suspects String,
    verdict String,
    missing String,
    report_json String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (job_id, report_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;

CREATE TABLE IF NOT EXISTS diagnoses
(
    diagnosis_id String,
    job_id String,
    time DateTime64(3, 'UTC'),
    node_name String,
    source LowCardinality(String),
    kind LowCardinality(String),
    level LowCardinality(String),
    rank Int32,
    detail String,
    trusted Bool,
    action LowCardinality(String),
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (job_id, diagnosis_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;
