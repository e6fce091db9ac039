"""The product's questions to the history, each asked in one place.

Every query here is the text a Grafana panel runs (dashboards/*.json embed it
verbatim; pipeline/trainwarden/dashboards.py builds them and a test keeps the files in
step) and the text the CLI runs (`trainwarden history`, `trainwarden report`)
after ``macros.to_parameters``. It is written in the Grafana ClickHouse
plugin's dialect: ``$__timeFilter_ms(col)`` and friends, and the variables
``${job:sqlstring}``, ``${node:sqlstring}``, ``${source:sqlstring}`` whose
"All" value is ``'__all'``, and ``${limit}``.

Times leave as DateTime64 columns (Grafana needs them as times); ``run``
turns them into float seconds like the rest of the store's API.

Rules the queries keep:
- ``FINAL`` on every ReplacingMergeTree: a record is stored once per
  version. ``do_not_merge_across_partitions_select_final`` is safe because
  a record's partition (its detection month) is the same in every version,
  and it lets ClickHouse collapse partitions in parallel.
- Filters on the ordering key first (job_id), skipping indexes for the rest
  (migrations/0004).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time as _time
from typing import Mapping, Protocol

from trainwarden.store.macros import ALL, to_parameters
from trainwarden.store.schema import time_text  # noqa: F401  (re-exported for callers formatting times)

# DateTime64(3)'s range, the CLI's default time range.
EARLIEST_MS = -2208988800000
LATEST_MS = 10413791999999
NO_LIMIT = 2**64 - 1

JOB = "(${job:sqlstring} = '__all' OR job_id = ${job:sqlstring})"
NODE = "(${node:sqlstring} = '__all' OR node_name = ${node:sqlstring})"
SOURCE = "(${source:sqlstring} = '__all' OR error_source = ${source:sqlstring})"
FAULTS_FINAL = "fault_records FINAL"
SETTINGS = "SETTINGS do_not_merge_across_partitions_select_final = 1"
# Decisions that stop (part of) a job; notifications are records, not failures.
FAILURES = "('restart_job', 'restart_instance', 'fail_job')"
RESTARTS = "('restart_job', 'restart_instance')"


class Select(Protocol):
    def select(self, query: str, params: Mapping[str, object] | None = None) -> list[dict]: ...


@dataclasses.dataclass(frozen=True)
class Query:
    name: str
    title: str
    sql: str
    # (column, kind) in result order; kind: time, int, float, str, bool
    columns: tuple[tuple[str, str], ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)


def _q(name: str, title: str, sql: str, columns: str) -> Query:
    parsed = tuple(tuple(item.split(":")) for item in columns.split())
    return Query(name, title, sql.strip(), parsed)  # type: ignore[arg-type]


def _ms(expr: str) -> str:
    return f"toUnixTimestamp64Milli({expr})"


# Job wall time inside the picked range, in seconds; a running job (finished_at 0) runs until now.
_JOB_WALL_S = f"""
SELECT sum(greatest(0, least(if({_ms('finished_at')} = 0, {_ms('now64(3)')}, {_ms('finished_at')}),
                              {_ms('$__toTime_ms')})
                        - greatest({_ms('submitted_at')}, {_ms('$__fromTime_ms')}))) / 1000
FROM jobs FINAL WHERE {JOB}
"""

# Stage lengths of job restarts (instance restarts stop one instance, not the
# job), in seconds; a stage not reached counts 0.
_STAGES = f"""
SELECT
    greatest(0, if({_ms('decided_at')} > 0, {_ms('decided_at')} - {_ms('detected_at')}, 0)) / 1000 AS detect,
    greatest(0, if({_ms('stopped_at')} > 0, {_ms('stopped_at')} - {_ms('decided_at')}, 0)) / 1000 AS stop,
    greatest(0, if({_ms('restarted_at')} > 0, {_ms('restarted_at')} - {_ms('stopped_at')}, 0)) / 1000 AS restart,
    greatest(0, if({_ms('running_at')} > 0, {_ms('running_at')} - {_ms('restarted_at')}, 0)) / 1000 AS queue
FROM restart_stages FINAL
WHERE {JOB} AND instance_name = '' AND $__timeFilter_ms(detected_at)
"""

QUERIES: tuple[Query, ...] = (
    # error_message is one example of the group's messages (they differ only
    # in what the signature normalised away): any() instead of argMax() and
    # uniq() instead of uniqExact() (exact below 65,536 jobs a group, bar hash
    # collisions) halve the time of this query on 10 million records.
    _q("fault_details", "Aggregated fault details", f"""
SELECT error_source, error_code, error_signature, any(message) AS error_message,
       node_name, instance_name, count() AS count, uniq(job) AS jobs, argMax(job, at) AS last_job,
       min(at) AS first_time, max(at) AS last_time
FROM (
    SELECT error_source, error_code, error_signature, error_message AS message, node_name, instance_name,
           job_id AS job, time AS at
    FROM {FAULTS_FINAL}
    WHERE {JOB} AND {NODE} AND {SOURCE} AND $__timeFilter_ms(time)
)
GROUP BY error_source, error_code, error_signature, node_name, instance_name
ORDER BY count DESC, last_time DESC, error_source, error_code, error_signature, node_name, instance_name
LIMIT ${{limit}}
{SETTINGS}
""", "error_source:str error_code:int error_signature:str error_message:str node_name:str instance_name:str "
     "count:int jobs:int last_job:str first_time:time last_time:time"),

    _q("fault_list", "Fault records", f"""
SELECT * FROM (
    SELECT record_id, job_id, time, round, node_name, instance_name, error_code, error_message, error_source,
           action, result, duration_s, reason, rule, classifier, category, error_signature, updated_at,
           verdict, consequences, evidence
    FROM {FAULTS_FINAL}
    WHERE {JOB} AND {NODE} AND {SOURCE} AND $__timeFilter_ms(time)
    ORDER BY time DESC, record_id DESC
    LIMIT ${{limit}}
)
ORDER BY time, record_id
{SETTINGS}
""", "record_id:str job_id:str time:time round:int node_name:str instance_name:str error_code:int "
     "error_message:str error_source:str action:str result:str duration_s:float reason:str rule:str "
     "classifier:str category:str error_signature:str updated_at:time verdict:str consequences:str "
     "evidence:str"),

    _q("restarts_over_time", "Restarts and faults over time", f"""
SELECT $__timeInterval(time) AS bucket,
       countIf(action IN {RESTARTS}) AS restarts,
       countIf(action IN {FAILURES}) AS failures,
       count() AS records
FROM {FAULTS_FINAL}
WHERE {JOB} AND {NODE} AND {SOURCE} AND $__timeFilter_ms(time)
GROUP BY bucket
ORDER BY bucket
{SETTINGS}
""", "bucket:time restarts:int failures:int records:int"),

    _q("faults_by_source_over_time", "Faults by source over time", f"""
SELECT $__timeInterval(time) AS bucket, error_source, count() AS faults
FROM {FAULTS_FINAL}
WHERE {JOB} AND {NODE} AND {SOURCE} AND $__timeFilter_ms(time) AND action IN {FAILURES}
GROUP BY bucket, error_source
ORDER BY bucket, error_source
{SETTINGS}
""", "bucket:time error_source:str faults:int"),

    _q("faults_by_source", "Faults by source", f"""
SELECT error_source, count() AS faults, countIf(action IN {RESTARTS}) AS restarts
FROM {FAULTS_FINAL}
WHERE {JOB} AND {NODE} AND {SOURCE} AND $__timeFilter_ms(time) AND action IN {FAILURES}
GROUP BY error_source
ORDER BY faults DESC, error_source
{SETTINGS}
""", "error_source:str faults:int restarts:int"),

    _q("mtbf_mttr", "Mean time between failures and to recovery", f"""
WITH
    (SELECT count() FROM {FAULTS_FINAL}
     WHERE {JOB} AND $__timeFilter_ms(time) AND action IN {FAILURES}) AS failures,
    ({_JOB_WALL_S}) AS wall_s,
    (SELECT sum(detect + stop + restart + queue) FROM ({_STAGES})) AS down_s,
    (SELECT avg((if({_ms('running_at')} > 0, {_ms('running_at')}, {_ms('restarted_at')})
                 - {_ms('detected_at')}) / 1000)
     FROM restart_stages FINAL
     WHERE {JOB} AND $__timeFilter_ms(detected_at) AND {_ms('restarted_at')} > 0) AS recovery_s
SELECT failures, if(failures = 0, NULL, greatest(0, wall_s - down_s) / failures) AS mtbf_s,
       if(isNaN(recovery_s), NULL, recovery_s) AS mttr_s, wall_s
""", "failures:int mtbf_s:float mttr_s:float wall_s:float"),

    _q("goodput", "Goodput", f"""
WITH ({_JOB_WALL_S}) AS wall_s
SELECT greatest(0, wall_s - sum(detect + stop + restart + queue)) AS running_s,
       sum(detect) AS detecting_s, sum(stop) AS stopping_s, sum(restart) AS restarting_s,
       sum(queue) AS queued_s,
       if(wall_s = 0, NULL, running_s / wall_s) AS goodput
FROM ({_STAGES})
""", "running_s:float detecting_s:float stopping_s:float restarting_s:float queued_s:float goodput:float"),

    _q("worst_nodes", "Worst nodes", f"""
SELECT node_name, sum(faults) AS faults, sum(isolations) AS isolations, sum(losses) AS losses,
       max(last_time) AS last_time
FROM (
    SELECT node_name, count() AS faults, 0 AS isolations, 0 AS losses, max(time) AS last_time
    FROM {FAULTS_FINAL}
    WHERE {JOB} AND {NODE} AND $__timeFilter_ms(time) AND node_name != '' AND action IN {FAILURES}
    GROUP BY node_name
    UNION ALL
    SELECT node_name, 0 AS faults, countIf(state = 'isolated') AS isolations, countIf(state = 'lost') AS losses,
           max(time) AS last_time
    FROM node_events FINAL
    WHERE {NODE} AND $__timeFilter_ms(time)
    GROUP BY node_name
)
GROUP BY node_name
ORDER BY faults + isolations + losses DESC, node_name
LIMIT ${{limit}}
""", "node_name:str faults:int isolations:int losses:int last_time:time"),

    _q("node_events", "Node events", f"""
SELECT time, node_name, state, detail
FROM node_events FINAL
WHERE {NODE} AND $__timeFilter_ms(time)
ORDER BY time DESC, node_name
LIMIT ${{limit}}
""", "time:time node_name:str state:str detail:str"),

    _q("jobs", "Jobs", f"""
SELECT job_id, status, reason, framework, instances, rounds, submitted_at AS submitted,
       if({_ms('finished_at')} = 0, NULL, finished_at) AS finished
FROM jobs FINAL
WHERE {JOB} AND submitted_at <= $__toTime_ms
  AND ({_ms('finished_at')} = 0 OR finished_at >= $__fromTime_ms)
ORDER BY submitted_at DESC, job_id
LIMIT ${{limit}}
""", "job_id:str status:str reason:str framework:str instances:int rounds:int submitted:time finished:time"),

    _q("job_rounds", "Rounds and stage durations", f"""
SELECT round, if(instance_name = '', '(job)', instance_name) AS restarted, detected_at,
       greatest(0, if({_ms('decided_at')} > 0, {_ms('decided_at')} - {_ms('detected_at')}, 0)) / 1000 AS detecting_s,
       greatest(0, if({_ms('stopped_at')} > 0, {_ms('stopped_at')} - {_ms('decided_at')}, 0)) / 1000 AS stopping_s,
       greatest(0, if({_ms('restarted_at')} > 0, {_ms('restarted_at')} - {_ms('stopped_at')}, 0)) / 1000 AS restarting_s,
       greatest(0, if({_ms('running_at')} > 0, {_ms('running_at')} - {_ms('restarted_at')}, 0)) / 1000 AS queued_s,
       (if({_ms('running_at')} > 0, {_ms('running_at')}, {_ms('restarted_at')}) - {_ms('detected_at')}) / 1000
           AS total_s
FROM restart_stages FINAL
WHERE {JOB}
ORDER BY detected_at, record_id, instance_name
LIMIT ${{limit}}
""", "round:int restarted:str detected_at:time detecting_s:float stopping_s:float restarting_s:float "
     "queued_s:float total_s:float"),

    # A job's life as a sequence of states, for a state-timeline panel: each
    # row is the moment the job entered that state.
    _q("job_timeline", "Job timeline", f"""
SELECT at AS time, stage
FROM (
    SELECT submitted_at AS at, 'running' AS stage FROM jobs FINAL WHERE {JOB}
    UNION ALL
    SELECT finished_at AS at, toString(status) AS stage FROM jobs FINAL WHERE {JOB} AND {_ms('finished_at')} > 0
    UNION ALL
    SELECT tupleElement(step, 1) AS at, tupleElement(step, 2) AS stage
    FROM restart_stages FINAL
    ARRAY JOIN [(detected_at, 'detecting'), (decided_at, 'stopping'), (stopped_at, 'restarting'),
                (restarted_at, 'starting'), (running_at, 'running')] AS step
    WHERE {JOB} AND instance_name = '' AND {_ms('tupleElement(step, 1)')} > 0
)
ORDER BY time, stage
LIMIT ${{limit}}
""", "time:time stage:str"),

    _q("stack_suspects", "Stack reports: suspects", f"""
SELECT time, job_id, round, tool, processes, groups, suspects, verdict
FROM stack_reports FINAL
WHERE {JOB} AND $__timeFilter_ms(time)
ORDER BY time DESC, report_id
LIMIT ${{limit}}
""", "time:time job_id:str round:int tool:str processes:int groups:int suspects:str verdict:str"),

    _q("diagnoses", "Diagnosis findings", f"""
SELECT time, job_id, node_name, source, kind, level, rank, detail, trusted, action
FROM diagnoses FINAL
WHERE {JOB} AND {NODE} AND $__timeFilter_ms(time) AND source != 'advice'
ORDER BY time DESC, diagnosis_id
LIMIT ${{limit}}
""", "time:time job_id:str node_name:str source:str kind:str level:str rank:int detail:str trusted:bool "
     "action:str"),

    _q("diagnoses_by_kind", "Findings by kind", f"""
SELECT kind, level, count() AS findings, uniqExact(node_name) AS nodes, uniqExact(job_id) AS jobs,
       max(time) AS last_time
FROM diagnoses FINAL
WHERE {JOB} AND {NODE} AND $__timeFilter_ms(time) AND source != 'advice'
GROUP BY kind, level
ORDER BY findings DESC, kind, level
""", "kind:str level:str findings:int nodes:int jobs:int last_time:time"),

    _q("hang_advice", "Hang-interval advice", f"""
SELECT time, job_id, kind, detail
FROM diagnoses FINAL
WHERE {JOB} AND $__timeFilter_ms(time) AND source = 'advice'
ORDER BY time DESC, diagnosis_id
LIMIT ${{limit}}
""", "time:time job_id:str kind:str detail:str"),
)
QUERIES += (
    # Costs are cumulative on every row, so a job's totals are those of its newest row.
    _q("spot_costs", "Spot jobs: cost against on-demand", f"""
SELECT job_id, argMax(step, (at, version)) AS state, max(lost) AS preemptions, max(back) AS resumes,
       max(waited) AS queued_s, max(held) AS held_s, max(cost) AS paid, max(list_price) AS on_demand,
       if(max(list_price) > 0, 1 - max(cost) / max(list_price), 0) AS saved,
       min(at) AS first_time, max(at) AS last_time
FROM (
    SELECT job_id, state AS step, time AS at, updated_at AS version, preemptions AS lost, resumes AS back,
           queued_s AS waited, held_s AS held, paid AS cost, on_demand AS list_price
    FROM spot_transitions FINAL
    WHERE {JOB} AND $__timeFilter_ms(time)
)
GROUP BY job_id
ORDER BY last_time DESC, job_id
LIMIT ${{limit}}
""", "job_id:str state:str preemptions:int resumes:int queued_s:float held_s:float paid:float on_demand:float "
     "saved:float first_time:time last_time:time"),
)
BY_NAME = {q.name: q for q in QUERIES}

# The dashboards' variable queries: where the choices come from.
VARIABLE_QUERIES = {
    "job": "SELECT DISTINCT job_id FROM jobs FINAL ORDER BY job_id",
    "node": ("SELECT node_name FROM (SELECT DISTINCT node_name FROM fault_records WHERE node_name != ''"
             " UNION DISTINCT SELECT DISTINCT node_name FROM node_events) ORDER BY node_name"),
    "source": "SELECT DISTINCT error_source FROM fault_records WHERE error_source != '' ORDER BY error_source",
}


# ----------------------------------------------------------------- running

def parameters(job: str | None = None, node: str | None = None, source: str | None = None,
               since: float | None = None, until: float | None = None, interval_s: int = 60,
               limit: int | None = None) -> dict:
    """Query parameters of ``macros.to_parameters`` text; None means all."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    return {
        "job": ALL if job is None else job, "node": ALL if node is None else node,
        "source": ALL if source is None else source,
        "__from_ms": EARLIEST_MS if since is None else math.floor(since * 1000),
        "__to_ms": LATEST_MS if until is None else math.ceil(until * 1000),
        "__interval_s": max(1, int(interval_s)), "limit": NO_LIMIT if limit is None else limit,
    }


def run(sql: Select, name: str, **filters) -> list[dict]:
    """Run one product query with the CLI's filters; rows with Python values
    (times as float seconds, NULL as None)."""
    query = BY_NAME[name]
    rows = sql.select(to_parameters(query.sql), parameters(**filters))
    return [decode_row(query, row) for row in rows]


def decode_row(query: Query, row: dict) -> dict:
    out = {}
    for column, kind in query.columns:
        value = row[column]
        if value is None:
            out[column] = None
        elif kind == "time":
            out[column] = parse_time(value)
        elif kind == "int":
            out[column] = int(value)
        elif kind == "float":
            out[column] = float(value)
        elif kind == "bool":
            out[column] = value in (True, 1, "1", "true")
        else:
            out[column] = value
    return out


def parse_time(text: str | int | float) -> float:
    """A DateTime or DateTime64(3) in its UTC text form to float seconds, exact to the millisecond."""
    if isinstance(text, (int, float)):
        return float(text)
    whole, _, fraction = text.partition(".")
    moment = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    seconds = (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(seconds=1)
    millis = int((fraction + "000")[:3]) if fraction else 0
    return (seconds * 1000 + millis) / 1000


def since_seconds(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (90s, 15m, 24h, 7d, 2w) or a UTC time
    (2026-01-31, 2026-01-31T12:00, 2026-01-31 12:00:00). ValueError with the forms when neither."""
    now = _time.time() if now is None else now
    value = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if value and value[-1] in units and value[:-1].replace(".", "", 1).isdigit():
        return now - float(value[:-1]) * units[value[-1]]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            moment = datetime.datetime.strptime(value, fmt)
        except ValueError:
            continue
        return moment.replace(tzinfo=datetime.timezone.utc).timestamp()
    raise ValueError(f"{text!r} is neither a duration (90s, 15m, 24h, 7d, 2w) nor a UTC time (2026-01-31T12:00)")
