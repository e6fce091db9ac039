"""``trainwarden notify validate | test | log`` as real processes."""

import json
import shutil
from pathlib import Path

import standardwebhooks

from trainwarden.notify import JsonlDeliveryLog, Notifier, load_subscriptions, sample_event
from trainwarden.store import open_writer
from tests.notify.conftest import ENV, SECRET, subscription_yaml

INVALID = Path(__file__).parent / "invalid"


def test_validate_lists_the_shipped_examples(cli):
    result = cli("notify", "validate")
    assert result.code == 0, result
    for name in ("ops-webhook", "ml-oncall-slack", "team-dingtalk"):
        assert name in result.out
    data = json.loads(cli("notify", "validate", "--json").out)
    assert data["valid"] and [s["body"] for s in data["subscriptions"]] == ["json", "slack", "dingtalk"]


def test_validate_refuses_an_invalid_directory_naming_file_and_line(cli, tmp_path):
    shutil.copy(INVALID / "template_syntax_error.yaml", tmp_path / "subs.yaml")
    result = cli("notify", "validate", str(tmp_path))
    assert result.code == 2, result
    assert f"{tmp_path / 'subs.yaml'}:11:" in result.err and "template syntax error" in result.err


def test_validate_warns_about_environment_variables_that_are_not_set(cli, subs_dir):
    directory = subs_dir(subscription_yaml("ops", "https://alerts.example.com/hook"))
    result = cli("notify", "validate", str(directory), env={"TW_TOKEN": "t"})
    assert result.code == 0 and "needs $TW_SECRET" in result.err and "TW_TOKEN" not in result.err


def test_test_sends_a_signed_sample_and_prints_the_status_and_the_answer(cli, receiver, subs_dir):
    hook = receiver(body=b'{"accepted": true}')
    directory = subs_dir(subscription_yaml("local", hook.url, private=True))
    result = cli("notify", "test", "local", "--dir", str(directory), "--type", "job.failed", env=ENV)
    assert result.code == 0, result
    assert "HTTP 200" in result.out and '{"accepted": true}' in result.out
    [request] = hook.requests
    payload = standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
    assert payload["type"] == "job.failed" and request.webhook_id in result.out
    again = cli("notify", "test", "local", "--dir", str(directory), "--type", "job.failed", env=ENV)
    assert again.code == 0 and hook.requests[1].webhook_id != request.webhook_id  # a fresh id per test


def test_test_reports_a_failing_receiver_with_exit_1_and_masks_secrets(cli, receiver, subs_dir):
    hook = receiver(default=503, body=b"down, token was token-value-never-logged")
    directory = subs_dir(subscription_yaml("local", hook.url, private=True))
    result = cli("notify", "test", "local", "--dir", str(directory), env=ENV)
    assert result.code == 1, result
    assert "HTTP 503" in result.out and "down, token was ***" in result.out
    assert "token-value-never-logged" not in result.out + result.err
    assert len(hook.requests) == 1  # one attempt: a test is not retried


def test_test_names_an_unknown_subscription_and_a_missing_variable(cli, subs_dir):
    directory = subs_dir(subscription_yaml("ops", "https://alerts.example.com/hook"))
    unknown = cli("notify", "test", "nope", "--dir", str(directory), env=ENV)
    assert unknown.code == 2 and "no subscription named 'nope'" in unknown.err and "known: ops" in unknown.err
    unset = cli("notify", "test", "ops", "--dir", str(directory), env={"TW_TOKEN": "t"})
    assert unset.code == 2 and "needs $TW_SECRET" in unset.err


def test_log_reads_the_delivery_log_of_a_notifier_without_a_store_from_its_directory(
        cli, receiver, subs_dir, tmp_path):
    hook = receiver([400])
    state = tmp_path / "notify"
    subs = load_subscriptions(subs_dir(subscription_yaml("ops", hook.url)), allow_loopback=True)
    notifier = Notifier(subs, state, writer=JsonlDeliveryLog(state / "deliveries.jsonl"), env=ENV,
                        allow_loopback=True)
    notifier.submit(sample_event("job.failed", job_id="job-a"))
    notifier.submit(sample_event("custom.message", job_id="job-b"))
    assert notifier.drain(5)
    notifier.close()
    table = cli("notify", "log", "--notify-dir", str(state))
    assert table.code == 0 and "job-a" in table.out and "dead" in table.out and "delivered" in table.out
    rows = json.loads(cli("notify", "log", "--notify-dir", str(state), "--job", "job-b", "--json").out)
    assert [(r["job_id"], r["event_type"], r["status"], r["attempts"]) for r in rows] == [
        ("job-b", "custom.message", "delivered", 1)]



def test_log_reads_the_deliveries_table_of_the_history_store_by_default(cli, store, receiver, subs_dir, tmp_path):
    hook = receiver([400])
    subs = load_subscriptions(subs_dir(subscription_yaml("ops", hook.url)), allow_loopback=True)
    writer = open_writer(str(store))
    notifier = Notifier(subs, tmp_path / "notify", writer=writer, env=ENV, allow_loopback=True)
    notifier.submit(sample_event("job.failed", job_id="job-a"))
    notifier.submit(sample_event("custom.message", job_id="job-b"))
    assert notifier.drain(5)
    notifier.close()
    rows = json.loads(cli("notify", "log", "--json").out)
    assert [(r["job_id"], r["event_type"], r["status"], r["attempts"], r["http_status"]) for r in rows] == [
        ("job-a", "job.failed", "dead", 1, 400), ("job-b", "custom.message", "delivered", 1, 200)]
    assert "Bearer" not in json.dumps(rows) and ENV["TW_TOKEN"] not in json.dumps(rows)
    table = cli("notify", "log", "--job", "job-a")
    assert table.code == 0 and "job-a" in table.out and "job-b" not in table.out
