"""One job's history as a self-contained HTML page, for people without Grafana.

The numbers come from the dashboards' queries (store/analytics.py), the page
from a Jinja2 template (templates/report.html.j2) with inline SVG charts: the
rounds as a labelled timeline of stages with the faults on it, faults by
source, and where the time went (goodput). No script, no external file: the
page can be mailed or attached.

What the page promises an operator, and the code keeps:
- one count of faults everywhere: a fault is a record whose action stopped
  (part of) the job, the same ``analytics.FAILURES`` the dashboards count;
  other decisions (notifications, isolations) are listed apart;
- a round is one incarnation of the whole job; a restart is the transition
  between two rounds, never a round itself;
- a colour means one thing on the whole page, and red means a fault;
- "starting" is a restart's start-up (instances started, first line not yet
  printed); "queued" is only ever a spot job's wait for capacity.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import math
import time
from pathlib import Path
from typing import Sequence

import jinja2
from markupsafe import Markup, escape

from trainwarden.goodput import Goodput, RoundSpan, account, hang_silence_s
from trainwarden.hints import OUTCOME_HINTS
from trainwarden.store import analytics

TEMPLATES = Path(__file__).with_name("templates")
FAULT_ACTIONS = frozenset(ast.literal_eval(analytics.FAILURES))
FAULT_COLOUR = "#d62728"
END_COLOUR = "#333333"
BOUNDARY_COLOUR = "#555555"
STAGE_COLOURS = {
    "running": "#3b9c5a", "detecting": "#e9b53b", "stopping": "#8d6e63", "restarting": "#7a4fbf",
    "starting": "#3d8fd1", "queued": "#a3acb5",
}
# The breakdown of goodput.py: productive in the running colour; no badput in red (red is a fault).
SPENT_COLOURS = {"productive": STAGE_COLOURS["running"], "lost work": "#e377c2", "hang silence": "#bcbd22",
                 **{stage: STAGE_COLOURS[stage] for stage in ("detecting", "stopping", "restarting", "starting",
                                                              "queued")}}
LIMIT = 5000


class NoSuchJob(LookupError):
    pass


@dataclasses.dataclass
class Round:
    """One incarnation of the whole job: from its instances' start (the job's
    submission for round 0) until they were stopped for a restart, or the end."""

    number: int
    start: float
    end: float
    ended_by: str  # "restart", or the job's status when it is the last round
    restart: dict | None  # the job_rounds row of the restart that ended it
    faults: list[dict]
    stack_anchor: str = ""  # the id of this round's first stack report on the page, if it has one


@dataclasses.dataclass
class JobReport:
    job: dict
    start: float
    end: float
    rounds: list[Round]
    instance_restarts: list[dict]
    timeline: list[dict]
    faults: list[dict]  # fault records whose action stopped (part of) the job
    other_records: list[dict]  # notifications, isolations, ...
    fault_total: int  # all faults of the job, also when the lists are cut at LIMIT
    by_source: list[dict]
    goodput: dict
    mtbf: dict
    suspects: list[dict]
    diagnoses: list[dict]
    generated_at: float
    spot: list[dict] = dataclasses.field(default_factory=list)  # a spot job's cost against on-demand
    time_spent: Goodput | None = None  # goodput and badput by cause (goodput.py)
    deciding: dict | None = None  # the fault record of the decision that ended a failed job

    @property
    def stack_anchors(self) -> dict[int, str]:
        return {s["round"]: s["anchor"] for s in self.suspects if s["anchor"]}

    @property
    def job_restarts(self) -> int:
        return sum(1 for r in self.rounds if r.restart is not None)

    @property
    def is_spot(self) -> bool:
        return bool(self.spot)


def collect(reader: analytics.Select, job_id: str, now: float | None = None) -> JobReport:
    """Everything the page shows, from the store (NoSuchJob when the store has no such job)."""
    now = time.time() if now is None else now
    jobs = analytics.run(reader, "jobs", job=job_id)
    if not jobs:
        raise NoSuchJob(job_id)
    job = jobs[0]
    start, end = job["submitted"], job["finished"] or now
    span = {"job": job_id, "since": start, "until": end}
    everything = {"job": job_id, "limit": LIMIT}
    records = analytics.run(reader, "fault_list", **everything)
    faults = [f for f in records if f["action"] in FAULT_ACTIONS]
    by_source = analytics.run(reader, "faults_by_source", job=job_id)
    suspects = anchor_stack_reports(analytics.run(reader, "stack_suspects", **everything))
    restarts = analytics.run(reader, "job_rounds", **everything)
    spot = analytics.run(reader, "spot_costs", **everything)
    goodput = with_spot_waits(analytics.run(reader, "goodput", **span)[0], spot)
    rounds = build_rounds(job, end, [r for r in restarts if r["restarted"] == "(job)"], faults, suspects)
    deciding = deciding_fault(job, faults)
    return JobReport(
        job=job, start=start, end=end,
        rounds=rounds,
        instance_restarts=[r for r in restarts if r["restarted"] != "(job)"],
        timeline=[{"time": row["time"], "stage": row["stage"]}
                  for row in analytics.run(reader, "job_timeline", **everything)],
        faults=faults,
        other_records=[f for f in records if f["action"] not in FAULT_ACTIONS],
        fault_total=sum(row["faults"] for row in by_source),
        by_source=by_source,
        goodput=goodput,
        mtbf=analytics.run(reader, "mtbf_mttr", **span)[0],
        suspects=suspects,
        diagnoses=analytics.run(reader, "diagnoses", **everything) + analytics.run(reader, "hang_advice",
                                                                                  **everything),
        generated_at=now,
        spot=spot,
        time_spent=account(end - start, goodput, round_spans(rounds, deciding), spot=bool(spot)),
        deciding=deciding,
    )


def latest_job(reader: analytics.Select) -> str | None:
    """The id of the job submitted last (None: the store has none)."""
    jobs = analytics.run(reader, "jobs", limit=1)
    return jobs[0]["job_id"] if jobs else None


def deciding_fault(job: dict, faults: Sequence[dict]) -> dict | None:
    """The record of the decision that failed the job (the newest fail_job), if it failed."""
    if job["status"] != "failed":
        return None
    failing = [f for f in faults if f["action"] == "fail_job"]
    return failing[-1] if failing else None


def round_spans(rounds: Sequence["Round"], deciding: dict | None) -> list[RoundSpan]:
    """The rounds as goodput.py counts them: a round ends in a fault when a
    restart ended it, or when it is the last round of a failed job."""
    spans = []
    for index, round_ in enumerate(rounds):
        before = rounds[index - 1].restart if index else None
        startup = (before or {}).get("queued_s") or 0.0  # the restart's start-up stage (job_rounds' queued_s)
        if round_.restart is not None:
            fault_at = round_.restart["detected_at"]
            # An exit hang is no silence (the others may still work): only a hang's counts.
            hang = next((f for f in round_.faults if f["error_source"] == "hang"
                         and f["action"] in ("restart_job", "fail_job")), None)
        elif deciding is not None:
            # The last round of a failed job: nothing of it was delivered, its wind-down included.
            fault_at, hang = round_.end, deciding if deciding["error_source"] == "hang" else None
        else:
            fault_at, hang = None, None
        spans.append(RoundSpan(round_.start, fault_at, startup, hang_silence_s(hang["error_message"]) if hang else 0.0))
    return spans


def _stage_times(restart: dict) -> tuple[float, float]:
    """(stopped, started) of a job restart: when its round's instances were
    down and when the next round's were started, from the stage lengths."""
    stopped = restart["detected_at"] + restart["detecting_s"] + restart["stopping_s"]
    return stopped, stopped + restart["restarting_s"]


def anchor_stack_reports(suspects: Sequence[dict]) -> list[dict]:
    """The stack reports oldest first, the first of each round with the
    ``anchor`` its round's faults link to (a hang can be dumped twice)."""
    out, seen = [], set()
    for row in sorted(suspects, key=lambda s: s["time"]):
        out.append({**row, "anchor": "" if row["round"] in seen else f"stack-r{row['round']}"})
        seen.add(row["round"])
    return out


def build_rounds(job: dict, end: float, restarts: Sequence[dict], faults: Sequence[dict],
                 suspects: Sequence[dict]) -> list[Round]:
    """The job's rounds in order. Restart ``n`` ends round ``restart.round``
    and the next round starts when its instances were started."""
    anchors = {s["round"]: s["anchor"] for s in suspects if s["anchor"]}
    by_round: dict[int, list[dict]] = {}
    for fault in faults:
        by_round.setdefault(fault["round"], []).append(fault)
    rounds, begin, number = [], job["submitted"], 0
    for restart in sorted(restarts, key=lambda r: r["detected_at"]):
        number = restart["round"]
        stopped, started = _stage_times(restart)
        rounds.append(Round(number, begin, min(stopped, end), "restart", restart, by_round.get(number, [])))
        begin, number = min(started, end), number + 1
    rounds.append(Round(number, begin, end, job["status"], None, by_round.get(number, [])))
    for round_ in rounds:
        round_.stack_anchor = anchors.get(round_.number, "")
    return rounds


def with_spot_waits(goodput: dict, spot: Sequence[dict]) -> dict:
    """The goodput row with a spot job's waits for capacity taken out of its
    running time (the history query counts them as running)."""
    queued = sum(row["queued_s"] for row in spot)
    wall = sum(goodput.get(f"{stage}_s") or 0.0 for stage in ("running", "detecting", "stopping", "restarting",
                                                              "queued"))
    out = {
        "running_s": max((goodput.get("running_s") or 0.0) - queued, 0.0),
        "detecting_s": goodput.get("detecting_s") or 0.0,
        "stopping_s": goodput.get("stopping_s") or 0.0,
        "restarting_s": goodput.get("restarting_s") or 0.0,
        # goodput's queued_s is a restart's start-up (the column keeps its name for the dashboards' users).
        "starting_s": goodput.get("queued_s") or 0.0,
        "queued_s": queued,
    }
    out["goodput"] = None if goodput.get("goodput") is None or wall <= 0 else out["running_s"] / wall
    return out


# ------------------------------------------------------------------ charts

def _text(x: float, y: float, text: object, anchor: str = "start", size: int = 11, fill: str = "#333",
          cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return (f'<text{klass} x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}">'
            f"{escape(str(text))}</text>")


def _svg(label: str, width: int, height: int) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" class="chart">')


def _tick_step(total: float) -> float:
    """A round step that puts 4 to 10 ticks on an axis of ``total`` seconds."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400,
                 21600, 43200, 86400):
        if total / step <= 10:
            return step
    return 86400 * math.ceil(total / 86400 / 10)


def _elapsed(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def stage_spans(timeline: Sequence[dict], end: float) -> list[tuple[str, float, float]]:
    """(stage, begin, finish) from the moments the job entered each state;
    the job's end (succeeded, failed) is not a span."""
    steps = [row for row in timeline if row["time"] is not None]
    spans = []
    for index, row in enumerate(steps):
        if row["stage"] not in STAGE_COLOURS:
            continue
        finish = steps[index + 1]["time"] if index + 1 < len(steps) else end
        spans.append((row["stage"], row["time"], max(finish, row["time"])))
    return spans


def timeline_svg(report: JobReport, width: int = 1000) -> Markup:
    """The job from submission to the end: round labels and boundaries above,
    the stages as coloured spans, the faults as red markers (each a link to
    its row), an axis of elapsed time below, and a legend."""
    left, right = 12, 12
    labels_y, bar_y, bar_h = 34, 44, 30
    usable = width - left - right
    start, end = report.start, report.end
    total = max(end - start, 1e-3)

    def x_of(t: float) -> float:
        return left + usable * min(max(t - start, 0.0), total) / total

    parts = [_svg("rounds timeline", width, 150)]
    parts.append(_text(left, 12, _iso(start), size=10, fill="#666"))
    parts.append(_text(width - right, 12, _iso(end), anchor="end", size=10, fill="#666"))
    for stage, begin, finish in stage_spans(report.timeline, end):
        x0, x1 = x_of(begin), x_of(finish)
        parts.append(f'<rect class="stage stage-{escape(stage)}" x="{x0:.2f}" y="{bar_y}" '
                     f'width="{max(x1 - x0, 1.0):.2f}" height="{bar_h}" fill="{STAGE_COLOURS[stage]}">'
                     f'<title>{escape(stage)}: {_seconds(finish - begin)} from {escape(_iso(begin))}</title></rect>')
    for round_ in report.rounds:
        x0, x1 = x_of(round_.start), x_of(round_.end)
        parts.append(f'<line class="round-boundary" x1="{x0:.2f}" y1="{labels_y - 12}" x2="{x0:.2f}" '
                     f'y2="{bar_y + bar_h + 4}" stroke="{BOUNDARY_COLOUR}" stroke-width="1.5"/>')
        parts.append(f'<line x1="{x0:.2f}" y1="{labels_y + 3}" x2="{max(x1, x0 + 1):.2f}" y2="{labels_y + 3}" '
                     f'stroke="{BOUNDARY_COLOUR}" stroke-width="1"/>')
        label = f"round {round_.number}" if x1 - x0 >= 56 else (f"r{round_.number}" if x1 - x0 >= 18 else "")
        if label:
            parts.append(_text((x0 + x1) / 2, labels_y, label, anchor="middle", size=11, fill="#222",
                               cls="round-label"))
    if report.job["finished"]:
        x = x_of(report.job["finished"])
        parts.append(f'<rect class="job-end" x="{x - 2:.2f}" y="{bar_y - 4}" width="4" height="{bar_h + 8}" '
                     f'fill="{END_COLOUR}"><title>job {escape(report.job["status"])} at '
                     f'{escape(_iso(report.job["finished"]))}</title></rect>')
    for fault in report.faults:
        x = x_of(fault["time"])
        parts.append(f'<a href="#fault-{escape(fault["record_id"])}"><path class="fault-marker" '
                     f'd="M{x - 6:.2f},{bar_y - 11} L{x + 6:.2f},{bar_y - 11} L{x:.2f},{bar_y - 1} Z" '
                     f'fill="{FAULT_COLOUR}"/><line x1="{x:.2f}" y1="{bar_y}" x2="{x:.2f}" y2="{bar_y + bar_h}" '
                     f'stroke="{FAULT_COLOUR}" stroke-width="2"/><title>fault in round {fault["round"]}: '
                     f'{escape(fault["error_source"])} {escape(fault["instance_name"])} at {escape(_iso(fault["time"]))}'
                     f'</title></a>')
    axis_y = bar_y + bar_h + 16
    step = _tick_step(total)
    tick = 0.0
    while tick <= total + 1e-9:
        x = x_of(start + tick)
        parts.append(f'<line x1="{x:.2f}" y1="{bar_y + bar_h}" x2="{x:.2f}" y2="{bar_y + bar_h + 4}" stroke="#888"/>')
        parts.append(_text(x, axis_y, "0" if tick == 0 else "+" + _elapsed(round(tick, 3)), anchor="middle",
                           size=10, fill="#666"))
        tick += step
    # Spot waits have no place on this bar (the history keeps their total, not their times).
    legend = [(stage, STAGE_COLOURS[stage]) for stage in STAGE_COLOURS if stage != "queued"]
    x, legend_y = left, axis_y + 26
    for stage, colour in legend:
        parts.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{colour}"/>')
        parts.append(_text(x + 17, legend_y, stage))
        x += 30 + 7 * len(stage)
    parts.append(f'<path d="M{x},{legend_y - 10} L{x + 12},{legend_y - 10} L{x + 6},{legend_y + 1} Z" '
                 f'fill="{FAULT_COLOUR}"/>')
    parts.append(_text(x + 17, legend_y, "fault"))
    x += 30 + 7 * len("fault")
    parts.append(f'<line x1="{x + 6}" y1="{legend_y - 12}" x2="{x + 6}" y2="{legend_y + 2}" '
                 f'stroke="{BOUNDARY_COLOUR}" stroke-width="1.5"/>')
    parts.append(_text(x + 17, legend_y, "round start"))
    parts.append("</svg>")
    return Markup("".join(parts))


def bars_svg(rows: Sequence[dict], label: str, value: str, colour: str, width: int = 460) -> Markup:
    """Horizontal bars, one per row, longest first as given."""
    row_h, label_w = 26, 150
    height = max(len(rows), 1) * row_h + 10
    top = max((float(r[value]) for r in rows), default=0.0) or 1.0
    parts = [_svg(f"{label} chart", width, height)]
    if not rows:
        parts.append(_text(10, 20, "nothing recorded"))
    for index, row in enumerate(rows):
        y = 5 + index * row_h
        length = (width - label_w - 70) * float(row[value]) / top
        parts.append(_text(label_w - 8, y + 16, row[label], anchor="end"))
        parts.append(f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{max(length, 1.0):.1f}" '
                     f'height="{row_h - 8}" fill="{colour}"/>')
        parts.append(_text(label_w + length + 6, y + 16, row[value]))
    parts.append("</svg>")
    return Markup("".join(parts))


def goodput_svg(spent: Goodput, width: int = 460) -> Markup:
    """One stacked bar of the job's wall time by figure (goodput.py), and the seconds of each."""
    rows = list(spent.spent)
    total = sum(r.seconds for r in rows) or 1.0
    height = 40 + 20 * len(rows)
    parts = [_svg("goodput chart", width, height)]
    x = 10.0
    for row in rows:
        length = (width - 20) * row.seconds / total
        slug = row.cause.replace(" ", "-")
        if length > 0:
            parts.append(f'<rect class="stage stage-{slug}" x="{x:.2f}" y="6" width="{length:.2f}" '
                         f'height="22" fill="{SPENT_COLOURS[row.cause]}"><title>{row.cause}: '
                         f'{_seconds(row.seconds)}</title></rect>')
        x += length
    for index, row in enumerate(rows):
        y = 48 + index * 20
        parts.append(f'<rect x="10" y="{y - 10}" width="12" height="12" fill="{SPENT_COLOURS[row.cause]}"/>')
        parts.append(_text(28, y, f'{row.cause}: {_seconds(row.seconds)} ({100 * row.seconds / total:.1f} %)'))
    parts.append("</svg>")
    return Markup("".join(parts))


# ------------------------------------------------------------------- page

def _iso(ts: float | None) -> str:
    if not ts:
        return ""
    moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + f".{moment.microsecond // 1000:03d} UTC"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.2f} s"


def render(report: JobReport) -> str:
    # Everything from the store is job text (messages, instance names, even
    # job ids): autoescape on, and the charts escape what they embed.
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                     autoescape=jinja2.select_autoescape(["html", "j2"]),
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["iso"] = _iso
    environment.filters["seconds"] = _seconds
    template = environment.get_template("report.html.j2")
    goodput = report.time_spent.fraction
    return template.render(
        r=report,
        goodput_percent=None if goodput is None else 100 * goodput,
        hint=OUTCOME_HINTS.get(report.job["reason"] or "", "") if report.job["status"] == "failed" else "",
        stage_colours=STAGE_COLOURS, fault_colour=FAULT_COLOUR, spent_colours=SPENT_COLOURS,
        timeline_chart=timeline_svg(report),
        source_chart=bars_svg(report.by_source, "error_source", "faults", FAULT_COLOUR),
        goodput_chart=goodput_svg(report.time_spent),
    )
