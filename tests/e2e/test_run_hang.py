"""Hang, staged hang through the SDK, and exit hang, with real silent processes."""

import re

import pytest

from tests.e2e.helpers import run_behave

pytestmark = pytest.mark.e2e


def _times(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


def test_a_silent_sync_job_is_restarted_within_a_second_after_the_interval(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                        "--job-hang-interval=2",
                        "--hang-rank", "all", "--hang-at-step", "2", "--hang-rounds", "0", "--step-s", "0.05")
    assert result.code == 0, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "restart_job" and record["error_source"] == "hang"
    assert record["reason"] == "job_hang"
    silent_since = max(_times(r"hanging at ([\d.]+)", result.out))
    latency = record["time"] - silent_since
    # Never before the interval; at most one second after it.
    assert 2.0 <= latency <= 3.0, latency


def test_a_shorter_hang_detect_scope_from_the_sdk_catches_a_hang_sooner(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                        "--job-hang-interval=600",
                        "--scope-interval", "2", "--scope-silent-s", "60", "--scope-rounds", "0")
    assert result.code == 0, result
    [record] = [r for r in history(job_id) if r["result"] == "done"]
    assert record["error_source"] == "hang"
    entered = max(_times(r"scope 2 entered at ([\d.]+)", result.out))
    assert 2.0 <= record["time"] - entered <= 3.0


def test_silence_inside_a_minus_one_scope_is_not_a_hang(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                        "--job-hang-interval=2",
                        "--scope-interval", "-1", "--scope-silent-s", "5")
    assert result.code == 0, result
    assert result.out.count("scope left") == 2
    assert history(job_id) == []


def test_a_job_not_finishing_after_one_instance_exited_is_restarted_for_exit_hang(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --enable-job-exit-hang-detection=True "
                        "--job-exit-hang-interval=2",
                        "--finish-rank", "0", "--linger-rank", "1", "--linger-rounds", "0")
    assert result.code == 0, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "restart_job" and record["error_source"] == "exit_hang"
    assert record["reason"] == "exit_hang"


def test_hang_detection_is_off_unless_enabled(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --job-hang-interval=1",
                        "--scope-interval", "-1", "--scope-silent-s", "0", "--linger-rank", "all",
                        "--linger-rounds", "none", "--step-s", "1.5", "--steps", "2")
    assert result.code == 0, result
    assert history(job_id) == []
