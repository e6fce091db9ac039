"""`trainwarden report`: a self-contained HTML page of one job, checked in a
real headless Chromium (DOM and a screenshot kept under test-artifacts/)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trainwarden.store import SpoolWriter
from tests.history_seed import JOB_A, JOB_B, seed

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
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


@pytest.fixture
def seeded(store):
    return seed(SpoolWriter(store))


def test_the_report_rendered_in_chromium_shows_the_jobs_records_and_three_charts(cli, store, seeded, tmp_path):
    browser = _browser()
    page = tmp_path / "report.html"
    result = cli("report", "--job", JOB_A, "-o", str(page))
    assert result.code == 0, result
    dom = _chromium(browser, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert f'<span id="job-id">{JOB_A}</span>' in html
    faults = re.findall(r'<tr class="fault" data-record-id="([0-9a-f]+)">', html)
    assert len(faults) == 4  # three restarts and an isolation, the records of job A only
    assert "no output for 1800 s" in html and "RankCommHang on rank 2" in html
    assert "FileNotFoundError" not in html  # job B's failure stays out of job A's page
    assert html.count("<svg") >= 3 and 'aria-label="rounds timeline"' in html
    assert len(re.findall(r'class="stage stage-(detecting|stopping|restarting|queued)"', html)) >= 9
    assert re.search(r'<div class="v" id="restarts">3</div>', html)
    # Job A ran on spot capacity: what it paid against on-demand (1.50 of 4.50 so far).
    assert '<td class="num" id="spot-paid">1.50</td>' in html and "<td>running</td>" in html
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-job-a.png"
    shot.unlink(missing_ok=True)
    taken = _chromium(browser, f"--screenshot={shot}", "--window-size=1280,1800", page.as_uri())
    assert taken.returncode == 0, taken.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page with content, not a blank one


def test_the_report_is_self_contained_with_no_script_and_nothing_fetched(cli, store, seeded, tmp_path):
    page = tmp_path / "b.html"
    assert cli("report", "--job", JOB_B, "-o", str(page)).code == 0
    html = page.read_text("utf-8")
    assert "<script" not in html and "<link" not in html and not re.search(r'(src|href)="?(https?:)?//', html)
    assert 'id="job-status">failed<' in html and "FileNotFoundError: data.bin" in html


def test_text_from_the_history_is_escaped_not_markup(cli, store, tmp_path):
    from tests.store.store_factories import fault, job

    SpoolWriter(store).write([job("j<1>"), fault("r1", job_id="j<1>", error_message="<script>alert(1)</script>")])
    result = cli("report", "--job", "j<1>", "-o", "-")
    assert result.code == 0, result
    assert "<script>" not in result.out and "&lt;script&gt;alert(1)&lt;/script&gt;" in result.out


def test_a_job_the_store_does_not_have_is_one_sentence_and_exit_2(cli, store, seeded):
    result = cli("report", "--job", "nope", "-o", "x.html")
    assert result.code == 2 and "has no job 'nope'" in result.err and "Traceback" not in result.err


def test_an_unwritable_output_is_one_sentence_naming_the_flag(cli, store, seeded, tmp_path):
    result = cli("report", "--job", JOB_A, "-o", str(tmp_path / "missing-dir" / "r.html"))
    assert result.code == 2 and "--output" in result.err and "Traceback" not in result.err
