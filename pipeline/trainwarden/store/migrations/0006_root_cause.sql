-- Trainwarden history, version 6: the verdict on a failure and its root
-- cause. A fault record names the root-cause instance (instance_name, as
-- before); `verdict` is retryable, not_retryable or unknown (no evidence
-- either way: the rule pack's unknown policy decided), and `consequences`
-- lists the failures judged to be its aftermath ("worker-0: connection_lost;
-- worker-2 rank 3: connection_lost"). Records written before version 6
-- read as '' for both.
ALTER TABLE fault_records ADD COLUMN IF NOT EXISTS verdict LowCardinality(String) DEFAULT '';
ALTER TABLE fault_records ADD COLUMN IF NOT EXISTS consequences String DEFAULT '';
