-- Trainwarden history, version 7: the operational evidence a failure's
-- decision weighed beside the verdict on its lines (engine/operational.py):
-- the phase the lines show, whether the job made progress in its round, the
-- same error again, the node ("phase: training (lines); progress: step 250;
-- recurrence: first time in this job; node: node-a"). Records written before
-- version 7 read as ''.
ALTER TABLE fault_records ADD COLUMN IF NOT EXISTS evidence String DEFAULT '';
