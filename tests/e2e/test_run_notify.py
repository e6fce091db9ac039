"""Notifications from a real ``trainwarden run`` to real local HTTP receivers."""

import json
import sys
from pathlib import Path

import pytest
import standardwebhooks

from trainwarden.diagnose.collect import find_tool
from tests.e2e.helpers import run_behave
from tests.notify.conftest import ENV, SECRET, receiver, subscription_yaml  # noqa: F401 - receiver is a fixture

pytestmark = pytest.mark.e2e
STUCK = str(Path(__file__).parent / "programs" / "stuck.py")
NCCL = "RuntimeError: NCCL error: unhandled system error, NCCL version 2.18.1"
NAN = "The training loss of the job is NaN."


def write_subscriptions(tmp_path: Path, url: str, events: str, **retry) -> Path:
    directory = tmp_path / "notifications"
    directory.mkdir()
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", url, extra=f"events: {events}\n", rate=60, private=True, **retry))
    return directory


def notify_flags(tmp_path: Path, directory: Path) -> tuple:
    return ("--notifications", str(directory), "--notify-dir", str(tmp_path / "queue"), "--notify-drain", "20")


def test_a_crash_and_a_nan_message_deliver_restarted_message_succeeded_in_order_signed(
        cli, job_id, receiver, tmp_path):
    hook = receiver()
    directory = write_subscriptions(tmp_path, hook.url, '["job.*", "custom.message"]')
    result = run_behave(cli, job_id, "--enable-job-restart=True", "--fail-rank", "1", "--fail-rounds", "0",
                        "--fail-message", NCCL, "--message", NAN, "--message-rounds", "1",
                        "--message-rank", "0",
                        extra=notify_flags(tmp_path, directory), env=ENV)
    assert result.code == 0, result
    payloads = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    assert [p["type"] for p in payloads] == ["job.restarted", "custom.message", "job.succeeded"]
    restarted, message, succeeded = (p["data"] for p in payloads)
    assert restarted["error_source"] == "instance_exit" and "NCCL error" in restarted["message"]
    assert restarted["instance"] == "worker-1" and restarted["round"] == 0
    assert message["message"] == NAN and message["round"] == 1
    assert succeeded["job_id"] == job_id and succeeded["job"]["framework"] == "pytorch"
    assert len({r.webhook_id for r in hook.requests}) == 3
    log = json.loads(cli("notify", "log", "--job", job_id, "--json").out)
    assert [(r["event_type"], r["status"], r["attempts"], r["http_status"]) for r in log] == [
        ("job.restarted", "delivered", 1, 200), ("custom.message", "delivered", 1, 200),
        ("job.succeeded", "delivered", 1, 200)]
    assert all(r["latency_ms"] > 0 for r in log)


def test_the_hang_notification_carries_the_stack_report_naming_the_odd_instance(cli, job_id, receiver, tmp_path):
    tool = next((t for t in ("py-spy", "pystack") if find_tool(t)), None)
    if tool is None:
        pytest.skip("neither py-spy nor pystack is installed here")
    hook = receiver()
    directory = write_subscriptions(tmp_path, hook.url, '["hang.detected", "job.restarted"]')
    result = cli("run", "--job-id", job_id, "--nproc", "4", "--args",
                 "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=2",
                 "--stack-tools", tool, "--stop-grace", "1", *notify_flags(tmp_path, directory), "--",
                 sys.executable, STUCK, env=ENV)
    assert result.code == 0, result
    payloads = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    assert [p["type"] for p in payloads] == ["hang.detected", "job.restarted"]
    report = payloads[0]["data"]["details"]["stack_report"]
    assert report["suspects"] == ["worker-3"] and report["tool"] == tool and report["processes"] == 4
    assert "worker-3" in report["verdict"]
    assert "details" not in payloads[1]["data"] or not (payloads[1]["data"]["details"] or {}).get("stack_report")


def test_a_receiver_down_for_the_whole_run_leaves_the_deliveries_queued_and_flush_sends_them(
        cli, job_id, receiver, tmp_path):
    hook = receiver(default=503)
    directory = write_subscriptions(tmp_path, hook.url, '["job.succeeded"]',
                                    retry="{max_attempts: 20, backoff_s: 0.3, max_backoff_s: 0.5}")
    flags = ("--notifications", str(directory), "--notify-dir", str(tmp_path / "queue"), "--notify-drain", "1")
    result = run_behave(cli, job_id, "", extra=flags, env=ENV, nproc=1)
    assert result.code == 0, result
    assert "1 notification deliveries still pending" in result.err
    assert hook.requests and all(r.webhook_id == hook.requests[0].webhook_id for r in hook.requests)
    hook.default = 200
    flushed = cli("notify", "flush", str(tmp_path / "queue"), "--notifications", str(directory), env=ENV)
    assert flushed.code == 0, flushed
    assert "1 of 1 pending deliveries finished (1 delivered" in flushed.out
    assert hook.requests[-1].webhook_id == hook.requests[0].webhook_id
    [row] = json.loads(cli("notify", "log", "--job", job_id, "--json").out)
    assert row["status"] == "delivered" and row["attempts"] >= 2


def test_an_invalid_subscriptions_directory_stops_the_run_before_it_starts_naming_file_and_line(
        cli, job_id, tmp_path):
    directory = tmp_path / "notifications"
    directory.mkdir()
    (directory / "bad.yaml").write_text("version: 1\nsubscriptions:\n  - name: ops\n    colour: red\n")
    result = run_behave(cli, job_id, "", extra=("--notifications", str(directory)), nproc=1)
    assert result.code == 2
    assert f"{directory / 'bad.yaml'}:3: a subscription needs 'target'" in result.err
    assert "hello" not in result.out


def test_a_job_failing_50_times_produces_a_bounded_number_of_messages_that_count_the_suppressed(
        cli, job_id, receiver, tmp_path):
    hook = receiver()
    directory = write_subscriptions(tmp_path, hook.url, '["job.*"]')  # at most one message a minute per type
    # A crash loop on purpose: the no-progress guard is off, so that all 50 failures happen.
    result = run_behave(cli, job_id, "--enable-job-restart=True --max-num-of-job-restart=50 --max-num-of-same-error=100 "
                        "--max-num-of-no-progress-restart=-1",
                        "--fail-rank", "0",
                        "--fail-at-step", "0", "--fail-message", NCCL, nproc=1, timeout=240,
                        extra=notify_flags(tmp_path, directory), env=ENV)
    assert result.code == 1, result
    payloads = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    summary = [(p["type"], p["data"]["suppressed_count"]) for p in payloads]
    # The first restart at once, the window's last one at the end carrying the other 48, the failure.
    assert sorted(summary) == [("job.failed", 0), ("job.restarted", 0), ("job.restarted", 48)], summary
    assert max(p["data"]["round"] for p in payloads if p["type"] == "job.restarted") == 49
    log = json.loads(cli("notify", "log", "--job", job_id, "--json").out)
    statuses = [r["status"] for r in log]
    assert statuses.count("delivered") == 3 and statuses.count("suppressed") == 48, statuses
