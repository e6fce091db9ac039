"""Delivery against real local HTTP servers: signatures, retries, dead letters, safety."""

import json
import logging
import time

import pytest
import standardwebhooks

from trainwarden.notify import NotifierSettings, read_delivery_log, sample_event
from trainwarden.notify.transport import attempt, parse_retry_after
from tests.notify.conftest import ENV, SECRET, crash_then_nan_decisions, subscription_yaml
from tests.notify.receiver import HANG


def statuses(notifier, event_id=None):
    return [(r.status, r.attempts, r.http_status) for r in notifier.log.records
            if event_id is None or r.event_id == event_id]


def test_a_receiver_gets_job_restarted_custom_message_and_job_succeeded_in_order_with_valid_signatures(
        receiver, subs_dir, notifier_for):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url, rate=60)))
    notifier.start()
    for decision in crash_then_nan_decisions():
        notifier.submit_decision(decision, {"framework": "pytorch"})
    assert notifier.drain(10)
    verifier = standardwebhooks.Webhook(SECRET)
    payloads = [verifier.verify(r.body, r.headers) for r in hook.requests]
    assert [p["type"] for p in payloads] == ["job.restarted", "custom.message", "job.succeeded"]
    assert [r.webhook_id for r in hook.requests] == [p["data"]["event_id"] for p in payloads]
    assert payloads[1]["data"]["message"] == "The training loss of the job is NaN."
    assert all(r.headers["authorization"] == "Bearer token-value-never-logged" for r in hook.requests)
    assert all(r.headers["content-type"] == "application/json" for r in hook.requests)
    assert [s for s, _, _ in statuses(notifier)] == ["delivered"] * 3
    tampered = dict(hook.requests[0].headers, **{"webhook-id": "evt_other"})
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        verifier.verify(hook.requests[0].body, tampered)


def test_a_receiver_answering_500_twice_then_200_gets_the_event_once_after_backoff(receiver, subs_dir, notifier_for):
    hook = receiver([500, 500, 200])
    notifier = notifier_for(subs_dir(subscription_yaml(
        "ops", hook.url, retry="{max_attempts: 4, backoff_s: 0.2, max_backoff_s: 1}")))
    notifier.start()
    event = sample_event("job.failed")
    notifier.submit(event)
    assert notifier.drain(10)
    assert hook.ids() == [event.id] * 3
    gaps = [b.at - a.at for a, b in zip(hook.requests, hook.requests[1:])]
    assert gaps[0] >= 0.1 - 0.01 and gaps[1] >= 0.2 - 0.01, gaps  # equal jitter: at least half of 0.2, 0.4
    assert statuses(notifier) == [("retrying", 1, 500), ("retrying", 2, 500), ("delivered", 3, 200)]
    assert notifier.stats()["delivered"] == 1 and notifier.stats()["retries"] == 2


def test_a_receiver_answering_400_is_not_retried_and_the_delivery_is_dead(receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver([400])
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)))
    notifier.start()
    notifier.submit(sample_event("job.failed"))
    assert notifier.drain(5)
    time.sleep(0.3)
    assert len(hook.requests) == 1
    [(status, attempts, code)] = statuses(notifier)
    assert (status, attempts, code) == ("dead", 1, 400)
    assert "HTTP 400 Bad Request: ok" in notifier.log.records[-1].error
    assert len(list((tmp_path / "state" / "dead").iterdir())) == 1


def test_a_receiver_that_never_answers_is_retried_then_dead_with_every_attempt_logged(
        receiver, subs_dir, notifier_for):
    hook = receiver(default=HANG)
    notifier = notifier_for(subs_dir(subscription_yaml(
        "ops", hook.url, timeout=0.2, retry="{max_attempts: 3, backoff_s: 0.05, max_backoff_s: 0.1}")))
    notifier.start()
    started = time.monotonic()
    notifier.submit(sample_event("hang.detected"))
    assert notifier.drain(10)
    assert len(hook.requests) == 3
    assert statuses(notifier) == [("retrying", 1, 0), ("retrying", 2, 0), ("dead", 3, 0)]
    assert all("timed out after 0.2 s" in r.error for r in notifier.log.records)
    assert "attempt 3 of 3" in notifier.log.records[-1].error
    assert all(r.latency_ms >= 190 for r in notifier.log.records)
    assert time.monotonic() - started < 5


def test_410_gone_disables_the_subscription_and_what_it_still_had_queued(receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver([410])
    directory = subs_dir(subscription_yaml("ops", hook.url))
    notifier = notifier_for(directory)
    first, second, third = (sample_event(t) for t in ("job.failed", "job.restarted", "node.lost"))
    notifier.submit(first)
    notifier.submit(second)
    notifier.run_once()
    notifier.submit(third)
    assert len(hook.requests) == 1 and notifier.pending() == 0
    assert [(r.event_type, r.status, r.http_status) for r in notifier.log.latest()] == [
        ("job.failed", "disabled", 410), ("job.restarted", "disabled", 0), ("node.lost", "disabled", 0)]
    notifier.close()
    again = notifier_for(directory)  # the state survives a restart...
    assert again.stats()["disabled_subscriptions"] == ["ops"]
    again.close()
    moved = receiver()
    edited = subs_dir(subscription_yaml("ops", moved.url))  # ...until the URL is edited
    assert notifier_for(edited).stats()["disabled_subscriptions"] == []


def test_retry_after_is_honoured_on_429(receiver, subs_dir, notifier_for):
    hook = receiver([(429, {"Retry-After": "1"}), 200])
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)))
    notifier.start()
    notifier.submit(sample_event("job.failed"))
    assert notifier.drain(10)
    assert len(hook.requests) == 2
    assert hook.requests[1].at - hook.requests[0].at >= 0.99
    assert statuses(notifier) == [("retrying", 1, 429), ("delivered", 2, 200)]


def test_retry_after_as_an_http_date_is_understood():
    now = 1_764_400_000.0
    assert parse_retry_after("Sat, 29 Nov 2025 07:07:10 GMT", now) == pytest.approx(30.0)
    assert parse_retry_after("120", now) == 120.0 and parse_retry_after("999999", now) == 3600.0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_a_metadata_address_is_refused_at_delivery_whether_written_resolved_or_mixed(subs_dir, notifier_for):
    directory = subs_dir(subscription_yaml("ops", "${HOOK_URL}"))
    names = {"hooks.example.com": ["169.254.169.254"], "mixed.example.com": ["93.184.216.34", "fd00:ec2::254"]}
    for url in ("http://169.254.169.254/latest/meta-data/", "http://hooks.example.com/x", "http://mixed.example.com/",
                "http://metadata.google.internal/computeMetadata/v1/"):
        notifier = notifier_for(directory, env={**ENV, "HOOK_URL": url},
                                resolver=lambda host, port: names.get(host, ["169.254.169.254"]))
        notifier.submit(sample_event("job.failed"))
        notifier.run_once()
        [record] = notifier.log.latest()
        assert record.status == "dead" and record.attempts == 1, record
        assert "refused" in record.error and "metadata" in record.error, record.error
        notifier.close()
        (directory.parent / "state" / "done.log").unlink()


def test_a_loopback_target_is_refused_unless_allowed(receiver, subs_dir, notifier_for):
    hook = receiver()
    directory = subs_dir(subscription_yaml("ops", "${HOOK_URL}"))
    notifier = notifier_for(directory, env={**ENV, "HOOK_URL": hook.url})
    notifier.allow_loopback = False
    notifier.submit(sample_event("job.failed"))
    notifier.run_once()
    assert hook.requests == [] and "loopback" in notifier.log.latest()[0].error


def test_secrets_never_reach_the_delivery_log_the_log_file_or_the_logs(receiver, subs_dir, notifier_for, tmp_path,
                                                                         caplog):
    leak = f"echo: token-value-never-logged {SECRET}".encode()
    hook = receiver([500], default=400, body=leak)
    from trainwarden.notify import JsonlDeliveryLog

    path = tmp_path / "deliveries.jsonl"
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)), log=JsonlDeliveryLog(path))
    caplog.set_level(logging.DEBUG, logger="trainwarden.notify")
    notifier.submit(sample_event("job.failed"))
    notifier.drain(5)
    written = path.read_text() + caplog.text + "".join(p.read_text() for p in (tmp_path / "state").rglob("*.json*"))
    assert "echo: ***" in path.read_text()
    for secret in ("token-value-never-logged", SECRET, SECRET[len("whsec_"):]):
        assert secret not in written
    assert [r.status for r in read_delivery_log(path)] == ["dead"]


def test_a_response_body_is_read_only_up_to_the_bound(receiver):
    hook = receiver(default=500, body=b"x" * (1024 * 1024))
    result = attempt("POST", hook.url, [], b"{}", timeout_s=2, allow_private=False, allow_loopback=True)
    assert result.outcome == "retry" and result.http_status == 500
    assert len(result.body) == 64 * 1024 and len(result.error) < 2100  # masked, then cut to 1,000 when logged


def test_a_slow_subscription_does_not_hold_up_another(receiver, subs_dir, notifier_for):
    slow, fast = receiver(default=HANG), receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("slow", slow.url, timeout=2),
                                     subscription_yaml("fast", fast.url)))
    notifier.start()
    started = time.monotonic()
    notifier.submit(sample_event("job.failed"))
    assert slow.wait_for(1, timeout=2.0)
    while not notifier.log.records and time.monotonic() - started < 2.0:
        time.sleep(0.01)
    assert time.monotonic() - started < 1.5  # well before the slow one's 2 s timeout
    assert [(r.subscription, r.status) for r in notifier.log.records] == [("fast", "delivered")]


def test_a_subscriptions_deliveries_keep_their_order_across_retries(receiver, subs_dir, notifier_for):
    hook = receiver([503, 200, 200])
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)))
    first, second = sample_event("job.restarted"), sample_event("job.failed")
    notifier.submit(first)
    notifier.submit(second)
    notifier.start()
    assert notifier.drain(5)
    assert hook.ids() == [first.id, first.id, second.id]


def test_a_resubmitted_event_is_delivered_once(receiver, subs_dir, notifier_for):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)))
    event = sample_event("job.failed")
    assert notifier.submit(event) == 1 and notifier.submit(event) == 0
    notifier.drain(5)
    assert notifier.submit(event) == 0
    assert hook.ids() == [event.id] and notifier.stats()["duplicates"] == 2


def test_a_full_queue_refuses_new_deliveries_and_records_them_dead(receiver, subs_dir, notifier_for):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)), settings=NotifierSettings(max_pending=2))
    for event_type in ("job.failed", "job.restarted", "node.lost"):
        notifier.submit(sample_event(event_type))
    assert notifier.pending() == 2
    [refused] = [r for r in notifier.log.records if r.status == "dead"]
    assert refused.event_type == "node.lost" and "queue full" in refused.error


def test_a_missing_environment_variable_makes_the_delivery_dead_naming_it(subs_dir, notifier_for, receiver):
    hook = receiver()
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)), env={"TW_TOKEN": "t"})
    notifier.submit(sample_event("job.failed"))
    notifier.run_once()
    assert notifier.log.latest()[0].error == "environment variable TW_SECRET is not set"
    assert hook.requests == []


def test_the_body_is_the_rendered_template_and_the_same_bytes_on_every_attempt(receiver, subs_dir, notifier_for):
    hook = receiver([502, 200])
    notifier = notifier_for(subs_dir(subscription_yaml("chat", hook.url, extra="template: slack\n")))
    notifier.start()
    notifier.submit(sample_event("job.failed"))
    assert notifier.drain(5)
    first, second = hook.requests
    assert first.body == second.body and first.webhook_id == second.webhook_id
    assert json.loads(first.body)["text"].startswith(":red_circle: *job.failed*")
    standardwebhooks.Webhook(SECRET).verify(second.body, second.headers)


def test_a_header_value_http_cannot_carry_is_dead_at_once_and_its_secret_never_written(
        receiver, subs_dir, notifier_for, caplog):
    hook = receiver()
    env = dict(ENV, TW_TOKEN="sekrit-token-VALUE-1234\u200b")  # not Latin-1: http.client would quote it
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)), env=env)
    notifier.submit(sample_event("job.failed"))
    assert notifier.drain(5)
    [record] = [r for r in notifier.log.records if r.status != "retrying"]
    assert record.status == "dead" and record.attempts == 1 and "Latin-1" in record.error
    written = repr(notifier.log.records) + caplog.text
    assert "sekrit-token" not in written and not hook.requests


def test_a_delivered_answer_with_an_unreadable_retry_after_stays_delivered(receiver, subs_dir, notifier_for):
    hook = receiver([(200, {"Retry-After": "\u00b9"}), (200, {"Retry-After": "Mon, 01 Jan 99999999999 00:00:00 GMT"})])
    notifier = notifier_for(subs_dir(subscription_yaml("ops", hook.url)))
    notifier.submit(sample_event("job.failed", job_id="a"))
    notifier.submit(sample_event("job.failed", job_id="b"))
    assert notifier.drain(5)
    assert [r.status for r in notifier.log.latest()] == ["delivered", "delivered"] and len(hook.requests) == 2


def test_a_switched_off_subscription_sends_nothing_it_had_queued(receiver, subs_dir, notifier_for, tmp_path):
    hook = receiver([503])
    retry = "{max_attempts: 5, backoff_s: 5}"
    directory = subs_dir(subscription_yaml("ops", hook.url, retry=retry))
    first = notifier_for(directory, state=tmp_path / "q")
    first.submit(sample_event("job.failed"))
    first.run_once()  # 503: stays queued for a retry
    first.close()
    subs_dir(subscription_yaml("ops", hook.url, retry=retry, extra="enabled: false\n"))
    second = notifier_for(directory, state=tmp_path / "q")
    assert second.drain(5)
    assert len(hook.requests) == 1 and second.log.latest()[-1].status == "disabled"


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_attempts_budget():
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    stop = threading.Event()

    def trickle():
        conn, _ = server.accept()
        conn.recv(65536)
        while not stop.is_set():  # the status line a byte at a time, each within the read timeout
            try:
                conn.sendall(b"H")
            except OSError:
                break
            time.sleep(0.2)
        conn.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    result = attempt("POST", f"http://127.0.0.1:{server.getsockname()[1]}/hook", [], b"{}", timeout_s=0.5,
                     allow_private=False, allow_loopback=True)
    took = time.monotonic() - started
    stop.set()
    server.close()
    assert result.outcome == "retry" and "no complete answer within 2 s" in result.error, result
    assert took < 4, took
