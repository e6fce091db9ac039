"""What a user can change when a job ended for a given reason: shown after
the summary line of `run` and `submit --follow`, and in the report."""

from __future__ import annotations

OUTCOME_HINTS = {
    "restarts_disabled": "restarts are off (the default): add --enable-job-restart=True to --args (or to the job "
                         "file's args:) to let Trainwarden restart the job, and --max-num-of-job-restart=N to "
                         "bound it",
    "no_progress": "every restart failed again before the job got further (a crash loop); if it was making "
                   "progress, say so with the SDK's monitor.report_progress(step), or raise "
                   "--max-num-of-no-progress-restart (-1: off)",
    "restart_limit_reached": "the job used up its restarts: --max-num-of-job-restart=N allows more, if the "
                             "faults are transient",
}
