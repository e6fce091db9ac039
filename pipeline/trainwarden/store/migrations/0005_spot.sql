-- Trainwarden history, version 5: spot jobs. One row per lifecycle step
-- (queue_job, start_job, requeue, resume_job, complete_job, fail_job) with
-- the cost so far; a job's newest row holds its totals (queries.job_costs).

CREATE TABLE IF NOT EXISTS spot_transitions
(
    record_id String,
    job_id String,
    time DateTime64(3, 'UTC'),
    round UInt32,
    state LowCardinality(String),
    action LowCardinality(String),
    reason LowCardinality(String),
    message String,
    paid Float64,
    on_demand Float64,
    held_s Float64,
    queued_s Float64,
    preemptions UInt32,
    resumes UInt32,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (job_id, record_id)
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1;
