"""The report leads with the outcome and why, and its goodput counts a hang's
silence and the work a fault threw away as badput (real runs, real store)."""

from __future__ import annotations

import re
import sys

import pytest

from trainwarden import report
from trainwarden.goodput import RoundSpan, account, hang_silence_s
from trainwarden.store import open_reader

CRASH = "import sys; print('RuntimeError: NCCL error: unhandled system error', file=sys.stderr); sys.exit(1)"
# Round 0: works 1.5 s, then hangs (silent); round 1: works 1 s and finishes.
HANG_ONCE = ("import os, time\n"
             "first = os.environ['TRAINWARDEN_RESTART_ROUND'] == '0'\n"
             "for step in range(15 if first else 10):\n"
             "    print('step', step, flush=True); time.sleep(0.1)\n"
             "if first:\n"
             "    time.sleep(120)\n")


def _collect(store, job_id):
    with open_reader(str(store)) as reader:
        return report.collect(reader, job_id)


def _page(cli, tmp_path, *args: str) -> str:
    target = tmp_path / "report.html"
    result = cli("report", *args, "-o", str(target))
    assert result.code == 0, result
    return target.read_text()


def _text(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", page).replace("&#39;", "'").split())


def test_a_failed_job_leads_with_why_it_failed_and_its_goodput_is_not_100_percent(cli, store, job_id, tmp_path):
    assert cli("run", "--job-id", job_id, "--", sys.executable, "-c", CRASH).code == 1
    figures = _collect(store, job_id)
    assert figures.time_spent.fraction < 0.2, figures.time_spent  # the failed round's work was not delivered
    assert [s.cause for s in figures.time_spent.spent][:3] == ["productive", "lost work", "hang silence"]
    page = _page(cli, tmp_path)  # without --job: the latest job
    text = _text(page)
    assert text.index("The job failed (restarts_disabled)") < text.index("wall time") < text.index("Rounds timeline")
    assert re.search(r"Why: RuntimeError: NCCL error: unhandled system error \(category \w+, .*decided by rule "
                     r"\w+, on worker-0", text), text[:1500]
    assert "add --enable-job-restart=True to --args" in text
    assert 'id="mtbf"' not in page and "100.0 %" not in text.split("Where the time went")[0]


ROUND_0_WORK_S = 1.5  # HANG_ONCE's 15 steps of 0.1 s before it hangs
HANG_INTERVAL_S = 2


def test_a_hang_counts_its_silence_and_the_work_it_threw_away_as_badput(cli, store, job_id, tmp_path):
    args = f"--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval={HANG_INTERVAL_S}"
    result = cli("run", "--job-id", job_id, "--stack-tools", "none", "--args", args, "--",
                 sys.executable, "-c", HANG_ONCE, timeout=180)
    assert result.code == 0, result
    figures = _collect(store, job_id)
    spent = {s.cause: s.seconds for s in figures.time_spent.spent}
    assert HANG_INTERVAL_S <= spent["hang silence"] <= HANG_INTERVAL_S + 1.5, spent  # detected at the next tick
    # Round 0's steps were thrown away, and its interpreter's start-up (0.13 s
    # here, 1.63 s lost in all). Counting nothing thrown away gives 0; counting
    # the hang's silence as lost work too adds at least the interval.
    assert ROUND_0_WORK_S <= spent["lost work"] < ROUND_0_WORK_S + HANG_INTERVAL_S, spent
    assert sum(spent.values()) == pytest.approx(figures.time_spent.wall_s)
    assert figures.time_spent.fraction < spent["productive"] / (figures.time_spent.wall_s - spent["hang silence"])
    text = _text(_page(cli, tmp_path, "--job", job_id))
    assert "The job succeeded after 1 job restart." in text and "hang silence" in text
    assert "the instances were silent before a hang was detected" in text


def test_badput_takes_the_silence_of_the_hang_out_of_a_rounds_running_time():
    rounds = [RoundSpan(start=0.0, fault_at=30.0, startup_s=0.0, silence_s=10.0),
              RoundSpan(start=32.0, fault_at=None, startup_s=3.0)]
    spent = account(100.0, {"detecting_s": 1.0, "stopping_s": 1.0, "restarting_s": 0.0, "starting_s": 3.0},
                    rounds)
    by_cause = {s.cause: s.seconds for s in spent.spent}
    assert by_cause["hang silence"] == 10.0 and by_cause["lost work"] == 20.0
    assert by_cause["productive"] == pytest.approx(100 - 5 - 30) and spent.fraction == pytest.approx(0.65)
    assert hang_silence_s("no output from any of the 2 running instances for at least 5 s (longest silence 5 s)") == 5
    assert hang_silence_s("no output for 1800 s") == 1800 and hang_silence_s("RuntimeError: CUDA error") == 0


def test_the_report_counts_one_of_a_kind_in_the_singular(cli, store, job_id, tmp_path):
    assert cli("run", "--job-id", job_id, "--", sys.executable, "-c", CRASH).code == 1
    text = _text(_page(cli, tmp_path, "--job", job_id))
    for said in ("1 instance", "1fault", "1round", "0job restarts"):
        assert re.search(rf"{said}\b", text), (said, text[:2000])
