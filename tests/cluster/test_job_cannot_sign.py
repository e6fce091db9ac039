"""Issue 29, break 1, as attacks on a real Kafka broker (TRAINWARDEN_KAFKA):
two agents, a processor and an actuator sharing a signing keyring.

- A job hunts for the key: every /proc/*/environ, cmdline and descriptor it
  can read, every file under the test's directory, the key file itself; with
  anything it finds it signs a start_instance for the other node that runs
  ``id > PWNED``. The agents run their instances as another user
  (--run-as 65534): it finds nothing, and nothing runs.
- An outside process with no key produces unsigned log batches for another
  job's hung instance, naming the right node: they are refused, and the hang
  is detected on time.
- The services, started with the key in their environment and as a user
  whose processes a job could be, show the key in no /proc file, and a
  process of their own user can read neither their environment nor their
  memory."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.processes import ServiceProcesses, behave, wait_for
from tests.conftest import ROOT
from tests.other_user import DUMPABLE_PROBE, OTHER_UID, other_python, other_writable, python_path

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

HUNTER = ROOT / "tests" / "e2e" / "programs" / "key_hunter.py"
SECRET = "k1" * 8 + "0123456789abcdef0123456789abcdef"
ENV_SECRET = "e" * 16 + "fedcba9876543210fedcba9876543210"
SIGNING_ENV = ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_SIGNING_KEY_FILE", "TRAINWARDEN_TRUSTED_NETWORK",
               "TRAINWARDEN_SIGNING_MAX_AGE", "TRAINWARDEN_ACCEPT_UNSIGNED_LOGS")
# How the agents start instances: as another user than theirs (and than the test's).
AGENT_ARGS = ("--run-as", str(OTHER_UID))
HANG_INTERVAL_S = 5
# From the last line of the hung instance to the hang decision reaching `submit --follow`: the interval, the
# processor's tick and the actuator's and the follower's polls, on a loaded 2-core machine.
HANG_SLACK_S = 12.0


@pytest.fixture(scope="module")
def cluster(bootstrap, tmp_path_factory):
    other_python()  # skips where jobs cannot run as another user
    tmp = tmp_path_factory.mktemp("hunted")
    key_file = tmp / "keyring"
    key_file.write_text(f"k1 {SECRET}\n")
    key_file.chmod(0o600)
    with pytest.MonkeyPatch.context() as env:
        for name in SIGNING_ENV:
            env.delenv(name, raising=False)
        env.setenv("TRAINWARDEN_SIGNING_KEY_FILE", str(key_file))
        services = ServiceProcesses(bootstrap, tmp, nodes=2, metrics=True, agent_args=AGENT_ARGS)
        services.key_file = key_file
        try:
            yield services
        finally:
            services.stop()


@pytest.fixture
def shared():
    path = other_writable()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def test_a_job_that_reads_every_environ_and_file_it_can_finds_no_key_and_starts_nothing(cluster, shared, job_id):
    python = other_python()
    report, pwned = shared / "report.json", shared / "PWNED"
    proc = cluster.submit("--job-id", job_id, "--", python, str(HUNTER), "--report", str(report), "--pwned",
                          str(pwned), "--nodes", ",".join(cluster.node_names), "--search", str(cluster.tmp),
                          "--search", str(cluster.store), "--key-file", str(cluster.key_file),
                          "--path", python_path())
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        _end(proc)
    assert proc.returncode == 0 and report.exists(), cluster.logs() + out[-3000:] + err[-3000:]
    hunt = json.loads(report.read_text())
    if hunt["sent"]:
        # Give a command signed with a key it found the time to reach the other agent and run.
        wait_for(pwned.exists, 30, "the signed command to run")
    # What it could not read: the services' environments and descriptors, the key file, the test's files.
    assert hunt["uid"] == OTHER_UID and hunt["groups"] == [], hunt
    assert hunt["read"]["environ"] >= 1 and hunt["refused"]["environ"] >= 4, hunt  # its own, not the services
    assert (hunt["found"], hunt["sent"], pwned.exists()) == ([], 0, False), hunt


def _end(proc: subprocess.Popen) -> None:
    """A follower left by a failed test: its job is the cluster's to end."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _follow(proc: subprocess.Popen) -> "queue.Queue[tuple[float, dict]]":
    """``submit --follow --json``'s events, each with the moment this process read it."""
    events: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                events.put((time.monotonic(), json.loads(line)))
        events.put((time.monotonic(), {"event": "eof"}))

    threading.Thread(target=read, daemon=True).start()
    return events


def _next(events: queue.Queue, wanted, timeout_s: float, what: str) -> tuple[float, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            moment, event = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {what} in {timeout_s:.0f} s") from None
        if event["event"] == "eof":
            raise AssertionError(f"the job's output ended before {what}")
        if wanted(event):
            return moment, event


def _forge(cluster, job_id: str, node: str, stop: threading.Event, sent: list) -> None:
    """An outside process with no key: unsigned log batches every 0.5 s for
    worker-0's hung incarnation, naming the node it runs on."""
    from kafka import KafkaProducer

    from trainwarden.bus.messages import Line, LogBatch
    from trainwarden.bus.serde import encode
    from trainwarden.events import Stream

    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap)
    try:
        while not stop.wait(0.5):
            batch = LogBatch(job_id=job_id, node=node, instance="worker-0", round=0, start=0,
                             lines=(Line(time.time(), Stream.STDOUT, "forged keepalive"),))
            producer.send(cluster.topic("logs"), key=job_id.encode(), value=encode(batch))
            producer.flush(10)
            sent[0] += 1
    finally:
        producer.close()


def test_unsigned_log_batches_for_another_jobs_hung_instance_do_not_keep_it_alive(cluster, job_id):
    python = other_python()
    refused_before = _refused_unsigned(cluster)
    proc = cluster.submit(
        "--job-id", job_id, "--json", "--args",
        f"--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval={HANG_INTERVAL_S}",
        "--", python, *behave("--env", "--keyword", "never-printed", "--steps", "6", "--step-s", "0.1",
                              "--hang-rank", "0", "--hang-rounds", "0", "--hang-at-step", "2")[1:])
    stop = threading.Event()
    try:
        events = _follow(proc)
        # Run as another user than its agent, it still reaches the agent's SDK endpoint as itself.
        _, keywords = _next(events, lambda e: e["event"] == "line" and e["text"].startswith("keywords"), 120,
                            "the SDK's answer")
        assert keywords["text"].startswith("keywords OK"), keywords
        _, env = _next(events, lambda e: e["event"] == "line" and e["text"].startswith("env {"), 60,
                       "worker-0's variables")
        node = json.loads(env["text"][4:])["TRAINWARDEN_NODE"]
        hung_at, _ = _next(events, lambda e: e["event"] == "line" and e["text"].startswith("hanging at"), 60,
                           "the hang")
        forged = [0]
        forger = threading.Thread(target=_forge, args=(cluster, job_id, node, stop, forged), daemon=True)
        forger.start()
        decided_at, decision = _next(events, lambda e: e["event"] == "decision" and e.get("round") == 0,
                                     HANG_INTERVAL_S + HANG_SLACK_S, "a decision about round 0 (the forged lines "
                                     "kept the hung instance alive)")
        assert (decision["kind"], decision["reason"]) == ("restart_job", "job_hang"), decision
        # Detected as if nothing had been forged, while batches were forged all along.
        assert decided_at - hung_at <= HANG_INTERVAL_S + HANG_SLACK_S and forged[0] >= HANG_INTERVAL_S, \
            (decided_at - hung_at, forged)
        stop.set()
        proc.wait(timeout=180)  # round 1 finishes; the reader thread drains standard output
        err = proc.stderr.read()
    finally:
        stop.set()
        _end(proc)
    assert proc.returncode == 0, cluster.logs() + err[-3000:]
    # The processor refused them as unsigned, dead letters each.
    assert _refused_unsigned(cluster) > refused_before


def _refused_unsigned(cluster) -> float:
    from urllib.request import urlopen

    with urlopen(cluster.metrics_url("processor"), timeout=10) as answer:
        text = answer.read().decode()
    found = [line for line in text.splitlines()
             if line.startswith('trainwarden_bus_messages_refused_total{reason="unsigned"}')]
    return float(found[0].split()[-1]) if found else 0.0


# ------------------------------------------------- the services' own processes


@pytest.fixture(scope="module")
def services_as_other_user(bootstrap, tmp_path_factory):
    """Every service as uid 65534 (the user a job could share with them),
    given the key in their environment."""
    from tests.notify.conftest import ENV, subscription_yaml

    python = other_python()
    home = other_writable()
    notifications = home / "notifications"
    notifications.mkdir()
    (notifications / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", "http://127.0.0.1:9/hook", private=True))
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in SIGNING_ENV:
                env.delenv(name, raising=False)
            env.setenv("TRAINWARDEN_SIGNING_KEY", ENV_SECRET)
            services = ServiceProcesses(bootstrap, home, nodes=1, user=OTHER_UID, python=python)
            services.env.update(ENV)
            services.start("notifier", "--notifications", str(notifications), "--notify-dir",
                           str(home / "notify-queue"), "--store", str(services.store))
            try:
                yield services
            finally:
                services.stop()
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


def test_the_services_show_the_key_in_no_proc_file_and_their_own_user_cannot_read_them(services_as_other_user):
    services = services_as_other_user
    wait_for(lambda: all("running:" in (services.tmp / f"{name}.log").read_text(errors="replace")
                         for name in services.procs), 90, "every service to run")
    python = other_python()
    probe = services.tmp / "probe.py"
    probe.write_text(DUMPABLE_PROBE)
    for name, proc in services.procs.items():
        log = (services.tmp / f"{name}.log").read_text(errors="replace")
        assert "messages signed with key id default" in log and ENV_SECRET not in log, log
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()  # as root: what any reader could see at most
        assert ENV_SECRET.encode() not in environ and b"TRAINWARDEN_SIGNING_KEY=" not in environ, name
        seen = subprocess.run([python, str(probe), str(proc.pid)], capture_output=True, text=True, timeout=60,
                              env={"PATH": os.defpath}, user=OTHER_UID, group=OTHER_UID, extra_groups=[])
        assert seen.stdout.splitlines() == ["environ refused 13", "mem refused 13", "fd refused 13"], (name, seen)
