-- Trainwarden history, version 3: the delivery log of event notifications
-- (pipeline/trainwarden/notify). One row per (event, subscription); the newest
-- updated_at wins. Rows never hold a URL, a header or a secret.

CREATE TABLE IF NOT EXISTS deliveries
(
    delivery_id String,
    event_id String,
    subscription LowCardinality(String),
    job_id String,
    event_type LowCardinality(String),
    time DateTime64(3, 'UTC'),
    attempts UInt32,
    status LowCardinality(String),
    http_status UInt16,
    latency_ms Float64,
    error String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (job_id, delivery_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;
