"""One job's history as a self-contained HTML page, for people without Grafana.

The numbers come from the dashboards' queries (store/analytics.py), the page
from a Jinja2 template (templates/report.html.j2) with inline SVG charts: the
rounds as a timeline of stages, faults by source, and where the time went
(goodput). No script, no external file: the page can be mailed or attached.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Sequence

import jinja2
from markupsafe import Markup, escape

from trainwarden.store import analytics

TEMPLATES = Path(__file__).with_name("templates")
STAGE_COLOURS = {"running": "#3b9c5a", "detecting": "#d9822b", "stopping": "#c23b3b", "restarting": "#7a4fbf",
                 "queued": "#2f7fc1", "succeeded": "#3b9c5a", "failed": "#8a1c1c"}
SOURCE_COLOUR = "#4a6fa5"
LIMIT = 5000


class NoSuchJob(LookupError):
    pass


@dataclasses.dataclass
class JobReport:
    job: dict
    start: float
    end: float
    rounds: list[dict]
    timeline: list[dict]
    faults: list[dict]
    by_source: list[dict]
    goodput: dict
    mtbf: dict
    suspects: list[dict]
    diagnoses: list[dict]
    generated_at: float
    spot: list[dict] = dataclasses.field(default_factory=list)  # a spot job's cost against on-demand


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
    return JobReport(
        job=job, start=start, end=end,
        rounds=analytics.run(reader, "job_rounds", **everything),
        timeline=analytics.run(reader, "job_timeline", **everything),
        faults=analytics.run(reader, "fault_list", **everything),
        by_source=analytics.run(reader, "faults_by_source", job=job_id),
        goodput=analytics.run(reader, "goodput", **span)[0],
        mtbf=analytics.run(reader, "mtbf_mttr", **span)[0],
        suspects=analytics.run(reader, "stack_suspects", **everything),
        diagnoses=analytics.run(reader, "diagnoses", **everything) + analytics.run(reader, "hang_advice",
                                                                                  **everything),
        generated_at=now,
        spot=analytics.run(reader, "spot_costs", **everything),
    )


# ------------------------------------------------------------------ charts

def _text(x: float, y: float, text: object, anchor: str = "start", size: int = 11, fill: str = "#333") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}">'
            f"{escape(str(text))}</text>")


def timeline_svg(timeline: Sequence[dict], start: float, end: float, width: int = 960) -> Markup:
    """The job's states from submission to the end as coloured spans on one bar,
    with a legend; each span's title tells its stage and length."""
    left, bar_y, bar_h = 10, 24, 28
    usable = width - 2 * left
    total = max(end - start, 1e-3)

    def x_of(t: float) -> float:
        return left + usable * min(max(t - start, 0.0), total) / total

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="rounds timeline" '
             f'width="{width}" height="96" viewBox="0 0 {width} 96" class="chart">']
    steps = [row for row in timeline if row["time"] is not None]
    for index, row in enumerate(steps):
        begin = row["time"]
        finish = steps[index + 1]["time"] if index + 1 < len(steps) else end
        if row["stage"] in ("succeeded", "failed"):
            finish = begin + total * 0.004  # a marker: the job is over
        x0, x1 = x_of(begin), x_of(finish)
        colour = STAGE_COLOURS.get(row["stage"], "#999")
        parts.append(f'<rect class="stage stage-{escape(row["stage"])}" x="{x0:.2f}" y="{bar_y}" '
                     f'width="{max(x1 - x0, 1.0):.2f}" height="{bar_h}" fill="{colour}">'
                     f'<title>{escape(row["stage"])}: {finish - begin:.1f} s from {escape(_iso(begin))}</title></rect>')
    parts.append(_text(left, 16, _iso(start)))
    parts.append(_text(width - left, 16, _iso(end), anchor="end"))
    for index, (stage, colour) in enumerate(list(STAGE_COLOURS.items())[:5]):
        x = left + index * 130
        parts.append(f'<rect x="{x}" y="70" width="12" height="12" fill="{colour}"/>')
        parts.append(_text(x + 18, 80, stage))
    parts.append("</svg>")
    return Markup("".join(parts))


def bars_svg(rows: Sequence[dict], label: str, value: str, width: int = 460, unit: str = "") -> Markup:
    """Horizontal bars, one per row, longest first as given."""
    row_h, label_w = 26, 150
    height = max(len(rows), 1) * row_h + 10
    top = max((float(r[value]) for r in rows), default=0.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)} chart" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" class="chart">']
    if not rows:
        parts.append(_text(10, 20, "nothing recorded"))
    for index, row in enumerate(rows):
        y = 5 + index * row_h
        length = (width - label_w - 70) * float(row[value]) / top
        parts.append(_text(label_w - 8, y + 16, row[label], anchor="end"))
        parts.append(f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{max(length, 1.0):.1f}" height="{row_h - 8}" '
                     f'fill="{SOURCE_COLOUR}"/>')
        shown = f"{float(row[value]):.1f}{unit}" if unit else f"{row[value]}"
        parts.append(_text(label_w + length + 6, y + 16, shown))
    parts.append("</svg>")
    return Markup("".join(parts))


def goodput_rows(goodput: dict) -> list[dict]:
    return [{"stage": stage, "seconds": goodput.get(f"{stage}_s") or 0.0}
            for stage in ("running", "detecting", "stopping", "restarting", "queued")]


def goodput_svg(goodput: dict, width: int = 460) -> Markup:
    """One stacked bar of the job's wall time by stage, and the seconds of each."""
    rows = goodput_rows(goodput)
    total = sum(r["seconds"] for r in rows) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="goodput chart" '
             f'width="{width}" height="{40 + 20 * len(rows)}" viewBox="0 0 {width} {40 + 20 * len(rows)}" '
             f'class="chart">']
    x = 10.0
    for row in rows:
        length = (width - 20) * row["seconds"] / total
        if length > 0:
            parts.append(f'<rect class="stage stage-{row["stage"]}" x="{x:.2f}" y="6" width="{length:.2f}" '
                         f'height="22" fill="{STAGE_COLOURS[row["stage"]]}"><title>{row["stage"]}: '
                         f'{row["seconds"]:.1f} s</title></rect>')
        x += length
    for index, row in enumerate(rows):
        y = 48 + index * 20
        parts.append(f'<rect x="10" y="{y - 10}" width="12" height="12" fill="{STAGE_COLOURS[row["stage"]]}"/>')
        parts.append(_text(28, y, f'{row["stage"]}: {row["seconds"]:.1f} s ({100 * row["seconds"] / total:.2f} %)'))
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
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                     autoescape=jinja2.select_autoescape(["html", "j2"]),
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["iso"] = _iso
    environment.filters["seconds"] = _seconds
    template = environment.get_template("report.html.j2")
    goodput = report.goodput.get("goodput")
    return template.render(
        r=report,
        goodput_percent=None if goodput is None else 100 * goodput,
        timeline_chart=timeline_svg(report.timeline, report.start, report.end),
        source_chart=bars_svg(report.by_source, "error_source", "faults"),
        goodput_chart=goodput_svg(report.goodput),
    )
