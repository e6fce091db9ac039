-- Trainwarden history, version 4: node events, and what the dashboards and
-- `trainwarden history --since/--node/--source` need at scale
-- (pipeline/trainwarden/store/analytics.py holds those queries; bench/history.py times
-- them on 10 million fault records).

-- One row per change of a node's state as the actuator saw it: isolated (by a
-- decision or an operator), lost (no heartbeat, or the agent left), ready
-- (uncordoned, or heard from again). event_id is derived from (node, state,
-- time), so the actuator replaying its state topic after a restart writes
-- the same rows again, which the ReplacingMergeTree collapses.
-- Ordered by node first: every node query (worst nodes, one node's history)
-- reads one contiguous range. No TTL, as for every table here (0001 says
-- why); deploy/clickhouse/cluster.md lists the TTLs a site may add.
CREATE TABLE IF NOT EXISTS node_events
(
    event_id String,
    node_name String,
    time DateTime64(3, 'UTC'),
    state LowCardinality(String),
    detail String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
PARTITION BY toYYYYMM(time)
ORDER BY (node_name, event_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;

-- fault_records is ordered by (job_id, record_id): the per-job query reads one
-- key range, and FINAL collapses the versions of a record. The dashboards
-- filter by time, node and source instead, so the table gets skipping indexes
-- for those: minmax on time (parts of other months are already pruned by the
-- partition key; inside a month rows arrive roughly in time order per job, so
-- granules carry narrow time ranges), a bloom filter on node_name (thousands
-- of nodes, one node's faults are rare), a set on error_source (a handful of
-- values). New parts get them on insert, existing parts when they merge.
-- The aggregated fault details group by (source, code, signature, node,
-- instance): dictionary-encoded keys make that grouping and the reading of
-- these columns several times cheaper. Nodes and instance names number in
-- the thousands, normalised signatures in the hundreds to thousands: well
-- inside what LowCardinality is for. (A type change is a mutation; existing
-- parts are converted in the background and read correctly meanwhile.)
ALTER TABLE fault_records MODIFY COLUMN node_name LowCardinality(String);
ALTER TABLE fault_records MODIFY COLUMN instance_name LowCardinality(String);
ALTER TABLE fault_records MODIFY COLUMN error_signature LowCardinality(String);

ALTER TABLE fault_records ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
ALTER TABLE fault_records ADD INDEX IF NOT EXISTS idx_node node_name TYPE bloom_filter(0.01) GRANULARITY 4;
ALTER TABLE fault_records ADD INDEX IF NOT EXISTS idx_source error_source TYPE set(16) GRANULARITY 4;
ALTER TABLE restart_stages ADD INDEX IF NOT EXISTS idx_detected detected_at TYPE minmax GRANULARITY 1;
ALTER TABLE diagnoses ADD INDEX IF NOT EXISTS idx_time time TYPE minmax GRANULARITY 1;
