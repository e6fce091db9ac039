"""``trainwarden notifier`` as a real process on a real Kafka broker, next to
the agents, the processor and the actuator."""

import json
import subprocess

import pytest
import standardwebhooks

from trainwarden.diagnose.collect import find_tool

from tests.cluster.processes import wait_for
from tests.cluster.test_cluster_kafka import NCCL, _finish, _submit, services  # noqa: F401 - fixtures
from tests.conftest import TRAINWARDEN
from tests.notify.conftest import ENV, SECRET, receiver, subscription_yaml  # noqa: F401 - fixture

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def _start_notifier(services, directory):
    services.env.update(ENV)
    return services.start("notifier", "--notifications", str(directory), "--notify-dir",
                          str(services.tmp / "notify-queue"), "--store", str(services.store))


def test_the_notifier_delivers_a_jobs_events_in_order_once_each_across_a_kill_with_the_hangs_stack_report(
        services, job_id, receiver, tmp_path):
    hook = receiver([503, 503])  # the first event needs retries: the kill lands mid-retry
    directory = tmp_path / "notifications"
    directory.mkdir()
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", hook.url, private=True, retry="{max_attempts: 30, backoff_s: 0.5, max_backoff_s: 1.0}"))
    _start_notifier(services, directory)
    proc = _submit(services, job_id, "--enable-job-restart=True --max-num-of-job-restart=5 "
                   "--enable-job-hang-detection=True --job-hang-interval=3",
                   "--steps", "12", "--step-s", "0.2", "--fail-rank", "1", "--fail-rounds", "0",
                   "--fail-at-step", "2", "--fail-message", NCCL, "--hang-rank", "all", "--hang-rounds", "1",
                   "--hang-at-step", "2")
    wait_for(lambda: len(hook.requests) >= 2, 90, "two failed attempts of the first event")
    services.kill("notifier")
    _start_notifier(services, directory)
    _finish(services, proc)

    def distinct():
        return list(dict.fromkeys(r.webhook_id for r in hook.requests))

    wait_for(lambda: len(distinct()) >= 4, 60, "four distinct events")
    verifier = standardwebhooks.Webhook(SECRET)
    first = {}
    for r in hook.requests:
        first.setdefault(r.webhook_id, verifier.verify(r.body, r.headers))
    types = [first[i]["type"] for i in distinct()]
    assert types == ["job.restarted", "hang.detected", "job.restarted", "job.succeeded"], types
    hang = first[distinct()[1]]["data"]
    report = hang["details"]["stack_report"]
    if find_tool("py-spy") or find_tool("pystack"):
        assert report["processes"] == 2 and report["missing"] == [], report
    else:
        assert report["processes"] == 0 and report["missing"], report
    # After the two 503s, a success for every event id; a kill during an attempt may repeat that one attempt.
    answered_ok = [r.webhook_id for r in hook.requests[2:]]
    assert set(answered_ok) == set(distinct()) and len(answered_ok) <= len(distinct()) + 1, answered_ok
    log = subprocess.run([*TRAINWARDEN, "notify", "log", "--job", job_id, "--json", "--store", str(services.store)],
                         env=services.env, capture_output=True, text=True, timeout=60)
    rows = json.loads(log.stdout)
    assert [r["status"] for r in rows] == ["delivered"] * 4, rows
    # The attempt count survives the kill: 3, or 2 when the kill came before the second attempt was written down.
    assert rows[0]["attempts"] in (2, 3), rows[0]
