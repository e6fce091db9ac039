"""`trainwarden report`: a self-contained HTML page of one job, checked in a
real headless Chromium: the DOM Chromium built (round labels, one fault count
everywhere, faults linked to their round's stack report) and a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trainwarden import report
from trainwarden.store import SpoolWriter, open_reader
from tests.history_seed import JOB_A, JOB_B, seed

ROOT = Path(__file__).resolve().parent.parent
# Copied there only when git ignores it: a test run must not leave files to commit.
ARTIFACT_DIRS = (ROOT / "tests" / "artifacts", ROOT / "test-artifacts")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless Chromium on this machine: `apt-get install -y chromium` (.ci/run installs it)")


def _chromium(browser: str, *args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-dev-shm-usage", *args], capture_output=True, text=True, timeout=120)


def _dom(browser: str, page: Path) -> str:
    dom = _chromium(browser, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def _ignored_artifact_dir() -> Path | None:
    for candidate in ARTIFACT_DIRS:
        probe = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(candidate / "x.png")])
        if probe.returncode == 0:
            return candidate
    return None


def _number(html: str, element_id: str) -> int:
    found = re.search(rf'id="{element_id}">(\d+)<', html)
    assert found, f"no #{element_id} in the page"
    return int(found.group(1))


@pytest.fixture
def seeded(store):
    return seed(SpoolWriter(store))


def test_the_report_in_chromium_labels_rounds_counts_faults_once_and_links_stack_reports(store, seeded, tmp_path):
    browser = _browser()
    page = tmp_path / "report.html"
    # Job A is still running: its page runs until "now", pinned to the end of the seeded history
    # (the CLI's own path is the other tests').
    with open_reader(str(store)) as reader:
        page.write_text(report.render(report.collect(reader, JOB_A, now=seeded.end)), encoding="utf-8")
    html = _dom(browser, page)
    assert f'<span id="job-id">{JOB_A}</span>' in html
    assert "FileNotFoundError" not in html  # job B's failure stays out of job A's page

    # Job A: three job restarts (rounds 0, 1, 2 restarted), so four rounds, the last still running.
    labels = re.findall(r'<text class="round-label"[^>]*>([^<]+)</text>', html)
    assert labels == ["round 0", "round 1", "round 2", "round 3"]
    assert html.count('class="round-boundary"') == 4
    assert re.findall(r'<tr class="round" id="round-(\d+)">', html) == ["0", "1", "2", "3"]
    assert _number(html, "round-count") == 4 and _number(html, "restarts") == 3

    # One count of faults: header, chart total, table caption, table rows, timeline markers.
    faults = re.findall(r'<tr class="fault" id="fault-([0-9a-f]+)"', html)
    markers = re.findall(r'<a href="#fault-([0-9a-f]+)"><path class="fault-marker"', html)
    counts = {"header": _number(html, "fault-count"), "faults by source": _number(html, "source-total"),
              "faults listed": _number(html, "faults-listed"), "rows": len(faults), "markers": len(markers)}
    assert set(counts.values()) == {3}, counts
    assert sorted(markers) == sorted(faults)
    # The C4D isolation is a decision, not a fault: listed apart, counted nowhere above.
    other = re.search(r'<table id="other-records">(.*?)</table>', html, re.S).group(1)
    assert "RankCommHang on rank 2" in other and "isolate_node" in other

    # The hang of round 1 links to round 1's stack report, which exists on the page.
    hang_row = next(row for row in re.findall(r'<tr class="fault".*?</tr>', html, re.S)
                    if "no output for 1800 s" in row)
    assert '<a class="stack-link" href="#stack-r1">' in hang_row
    assert re.search(r'<tr class="stack-report" id="stack-r1">.*?worker-1 is not in the collective', html, re.S)
    assert html.count('class="stack-link"') == 1  # the other rounds have no stack report

    # Red is for faults only; a stage never takes the fault colour.
    assert report.FAULT_COLOUR not in report.STAGE_COLOURS.values()
    stage_fills = set(re.findall(r'class="stage stage-\w+"[^>]*fill="(#[0-9a-f]+)"', html))
    assert stage_fills and report.FAULT_COLOUR not in stage_fills
    # Job A ran on spot capacity: "queued" is its wait, and what it paid against on-demand (1.50 of 4.50).
    assert '<td class="num" id="spot-paid">1.50</td>' in html and "queued: " in html

    shot = tmp_path / "report-job-a.png"
    taken = _chromium(browser, f"--screenshot={shot}", "--window-size=1280,1800", page.as_uri())
    assert taken.returncode == 0, taken.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page with content, not a blank one
    kept = _ignored_artifact_dir()
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, kept / shot.name)
    print(f"report screenshot: {shot}" + (f" (copied to {kept / shot.name})" if kept else ""))


def test_a_job_that_is_not_a_spot_job_shows_starting_and_never_queued(cli, store, seeded, tmp_path):
    browser = _browser()
    page = tmp_path / "b.html"
    assert cli("report", "--job", JOB_B, "-o", str(page)).code == 0
    html = _dom(browser, page)
    assert "queued" not in html
    assert 'class="stage stage-starting"' in html and "starting: " in html
    # Job B's two restarts, then the round that failed.
    assert re.findall(r'<text class="round-label"[^>]*>([^<]+)</text>', html) == ["round 0", "round 1", "round 2"]
    assert 'class="job-end"' in html
    assert _number(html, "fault-count") == _number(html, "source-total") == 3


def test_the_report_is_self_contained_with_no_script_and_nothing_fetched(cli, store, seeded, tmp_path):
    page = tmp_path / "b.html"
    assert cli("report", "--job", JOB_B, "-o", str(page)).code == 0
    html = page.read_text("utf-8")
    assert "<script" not in html and "<link" not in html and not re.search(r'(src|href)="?(https?:)?//', html)
    assert 'id="job-status">failed<' in html and "FileNotFoundError: data.bin" in html


def test_text_from_the_history_is_escaped_not_markup(cli, store, tmp_path):
    from tests.store.store_factories import fault, job, stages

    evil = "<b onmouseover=x>"
    SpoolWriter(store).write([
        job("j<1>"),
        fault("r1", job_id="j<1>", round=0, error_message="<script>alert(1)</script>", error_source=evil,
              instance_name=evil, node_name=evil),
        stages("r1", job_id="j<1>", round=0)])
    result = cli("report", "--job", "j<1>", "-o", "-")
    assert result.code == 0, result
    assert "<script>" not in result.out and "&lt;script&gt;alert(1)&lt;/script&gt;" in result.out
    assert evil not in result.out and "&lt;b onmouseover=x&gt;" in result.out
    assert "j&lt;1&gt;" in result.out and "j<1>" not in result.out


def test_rounds_follow_the_restarts_and_a_restart_is_never_a_round():
    job = {"submitted": 100.0, "status": "succeeded"}
    restarts = [
        {"round": 0, "restarted": "(job)", "detected_at": 110.0, "detecting_s": 1.0, "stopping_s": 2.0,
         "restarting_s": 0.5, "queued_s": 3.0, "total_s": 6.5},
        {"round": 1, "restarted": "(job)", "detected_at": 150.0, "detecting_s": 0.0, "stopping_s": 1.0,
         "restarting_s": 1.0, "queued_s": 2.0, "total_s": 4.0},
    ]
    faults = [{"round": 0, "record_id": "a"}, {"round": 1, "record_id": "b"}]
    suspects = report.anchor_stack_reports([{"round": 1, "time": 151.0}, {"round": 1, "time": 150.5}])
    rounds = report.build_rounds(job, 200.0, restarts, faults, suspects)
    assert [(r.number, r.start, r.end, r.ended_by) for r in rounds] == [
        (0, 100.0, 113.0, "restart"), (1, 113.5, 151.0, "restart"), (2, 152.0, 200.0, "succeeded")]
    assert [[f["record_id"] for f in r.faults] for r in rounds] == [["a"], ["b"], []]
    assert [r.stack_anchor for r in rounds] == ["", "stack-r1", ""]
    # Two dumps of one hang: the older one is the anchor.
    assert [(s["time"], s["anchor"]) for s in suspects] == [(150.5, "stack-r1"), (151.0, "")]


def test_a_spot_jobs_waits_are_queued_and_taken_out_of_running():
    goodput = {"running_s": 90.0, "detecting_s": 1.0, "stopping_s": 2.0, "restarting_s": 3.0, "queued_s": 4.0,
               "goodput": 0.9}
    plain = report.with_spot_waits(goodput, [])
    assert plain["starting_s"] == 4.0 and plain["queued_s"] == 0.0 and plain["goodput"] == pytest.approx(0.9)
    spot = report.with_spot_waits(goodput, [{"queued_s": 30.0}])
    assert spot["queued_s"] == 30.0 and spot["running_s"] == 60.0 and spot["goodput"] == pytest.approx(0.6)


def test_a_job_the_store_does_not_have_is_one_sentence_and_exit_2(cli, store, seeded):
    result = cli("report", "--job", "nope", "-o", "x.html")
    assert result.code == 2 and "has no job 'nope'" in result.err and "Traceback" not in result.err


def test_an_unwritable_output_is_one_sentence_naming_the_flag(cli, store, seeded, tmp_path):
    result = cli("report", "--job", JOB_A, "-o", str(tmp_path / "missing-dir" / "r.html"))
    assert result.code == 2 and "--output" in result.err and "Traceback" not in result.err
