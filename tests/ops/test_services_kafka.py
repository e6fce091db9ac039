"""Operating the services on a real Kafka broker: /metrics, /healthz and
/readyz of every service while a job runs, SIGHUP reloading the processor's
rules (a valid change takes effect, an invalid one is refused with file:line),
every service stopping within 5 s of SIGTERM (the notifier with a
rate-limited message held, which stays queued), `nodes` refusing unknown
nodes, and `submit --follow --json`."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.processes import ServiceProcesses, behave, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from tests.ops.support import get
from tests.notify.conftest import ENV, receiver, subscription_yaml  # noqa: F401 - fixture

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SITE_RULE = """\
version: 1
classifiers:
  - name: site_disk_glitch
    category: site_storage
    retryable: false
    priority: 99
    patterns:
      - 'SITE_DISK_GLITCH'
"""
BROKEN_RULE = """\
version: 1
classifiers:
  - name: site_other
    category: site_storage
    retryable: false
    colour: red
    patterns: ['SITE_OTHER']
"""
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
            "time.sleep(600)\n")
# Job text that JSON and a terminal both have to take as data.
AWKWARD = 'quote " backslash \\ tab\t<b>[/red]</b> done'


def _samples(services: ServiceProcesses, name: str) -> dict[str, float]:
    status, text = get(services.metrics_url(name))
    assert status == 200, text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + (json.dumps(sample.labels, sort_keys=True) if sample.labels else "")
            values[key] = sample.value
    return values


def _service_names(services: ServiceProcesses) -> list[str]:
    return [name for name in services.procs]


def _all_ready(services: ServiceProcesses) -> bool:
    return all(get(services.metrics_url(name, path))[0] == 200
               for name in _service_names(services) for path in ("/healthz", "/readyz"))


def _start_notifier(services: ServiceProcesses, directory: Path) -> subprocess.Popen:
    services.env.update(ENV)
    return services.start("notifier", "--notifications", str(directory), "--notify-dir",
                          str(services.tmp / "notify-queue"), "--store", str(services.store))


def _notifications(tmp: Path, url: str, rate: float = 0) -> Path:
    directory = tmp / "notifications"
    directory.mkdir(exist_ok=True)
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", url, private=True, rate=rate))
    return directory


class _Follow:
    """``submit --follow --json``, its stdout read as it comes."""

    def __init__(self, services: ServiceProcesses, job_id: str, args: str, *program: str, json_flag: str = "--json"):
        self.proc = subprocess.Popen(
            [*TRAINWARDEN, "submit", "--follow", *json_flag.split(), "--job-id", job_id, "--nproc", "2", "--args", args,
             "--", *behave(*program)], env=services.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.events: list[dict] = []
        self.raw: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.raw.append(line)
            self.events.append(json.loads(line))

    def decisions(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "decision"]

    def of_kind(self, kind: str) -> list[dict]:
        return [e for e in self.decisions() if e["kind"] == kind]

    def finish(self, services: ServiceProcesses, timeout: float = 120) -> int:
        self.proc.wait(timeout)
        self.reader.join(10)
        self.stderr = self.proc.stderr.read()
        return self.proc.returncode


def _glitch_job(services: ServiceProcesses, job_id: str, json_flag: str = "--json") -> _Follow:
    return _Follow(services, job_id, "--enable-job-restart=True --max-num-of-job-restart=3", "--steps", "15",
                   "--step-s", "0.2", "--say", AWKWARD, "--fail-rank", "1", "--fail-rounds", "0", "--fail-at-step",
                   "4", "--fail-message", "RuntimeError: NCCL error: unhandled system error (SITE_DISK_GLITCH on /scratch)",
                   json_flag=json_flag)


def _dashboard_queries() -> list[str]:
    board = json.loads((ROOT / "dashboards" / "services.json").read_text())
    queries = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert len(queries) >= 10
    return queries


def _hup_and_wait(services: ServiceProcesses, proc_name: str, text: str) -> str:
    log = services.tmp / f"{proc_name}.log"
    before = log.read_text(errors="replace")
    services.procs[proc_name].send_signal(signal.SIGHUP)
    wait_for(lambda: text in log.read_text(errors="replace")[len(before):], 20, f"'{text}' in the {proc_name} log")
    return log.read_text(errors="replace")[len(before):]


def test_every_service_serves_metrics_health_and_readiness_while_a_job_runs_and_sighup_reloads_the_rules(
        bootstrap, tmp_path, job_id, receiver):  # noqa: F811 - fixtures
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in (ROOT / "rules").glob("*.yaml"):
        shutil.copy(path, rules / path.name)
    hook = receiver()
    services = ServiceProcesses(bootstrap, tmp_path, metrics=True, rules=rules)
    try:
        _start_notifier(services, _notifications(tmp_path, hook.url))
        assert len(services.procs) == 6  # three agents, processor, actuator, notifier
        wait_for(lambda: _all_ready(services), 60, "/healthz and /readyz of every service answering 200")
        before = {name: _samples(services, name) for name in _service_names(services)}
        for name, values in before.items():
            (build,) = [json.loads(k[len("trainwarden_build_info"):]) for k in values
                        if k.startswith("trainwarden_build_info{")]
            assert build["component"] == ("agent" if name.startswith("agent-") else name), build
            assert build["version"] and build["version"] != "unknown", build

        # With the shipped rules the failure is an NCCL error: retried, and the job succeeds.
        follow = _glitch_job(services, job_id)
        wait_for(lambda: follow.of_kind("restart_job"), 90, "the job's restart")
        # The job is still running (round 1): every service answers, and is ready.
        during = {name: _samples(services, name) for name in _service_names(services)}
        assert all(get(services.metrics_url(name, "/readyz"))[0] == 200 for name in _service_names(services))
        assert follow.finish(services) == 0, services.logs() + follow.stderr
        after = {name: _samples(services, name) for name in _service_names(services)}
        (restart,) = follow.of_kind("restart_job")
        assert restart["classifier"] == "nccl_error", restart

        moved = lambda name, metric: after[name][metric] - before[name][metric]  # noqa: E731
        assert moved("processor", "trainwarden_processor_decisions_total") >= 3  # start, restart, complete
        assert moved("processor", "trainwarden_processor_log_lines_total") >= 30
        assert during["processor"]["trainwarden_processor_log_lines_total"] > \
            before["processor"]["trainwarden_processor_log_lines_total"]
        assert sum(moved(n, "trainwarden_agent_lines_total") for n in after if n.startswith("agent-")) >= 30
        assert moved("actuator", "trainwarden_actuator_decisions_total") >= 3
        assert moved("actuator", "trainwarden_actuator_commands_total") >= 4
        assert moved("notifier", "trainwarden_notifier_decisions_total") >= 3
        assert after["processor"]["trainwarden_decision_latency_seconds_count"] >= 3
        assert any(k.startswith("trainwarden_consumer_lag{") for k in after["processor"])
        wait_for(lambda: _samples(services, "notifier")["trainwarden_delivery_latency_seconds_count"] >= 2, 30,
                 "the job's events delivered and timed")
        # Every metric the services dashboard queries is one the services expose.
        exposed = {key.split("{")[0] for name in after for key in _samples(services, name)}
        for expr in _dashboard_queries():
            for metric in re.findall(r"\btrainwarden_\w+", expr):
                assert metric in exposed, (metric, expr)
            for pattern in re.findall(r'__name__=~"([^"]+)"', expr):
                assert any(re.fullmatch(pattern, metric) for metric in exposed), (pattern, expr)

        # The JSON lines: every output line and decision, job text intact.
        events = follow.events
        assert events[0] == {"event": "submitted", "job_id": job_id, "instances": 2, "runtime": "agents"}, events[0]
        assert {e["event"] for e in events[1:]} == {"line", "decision"}, {e["event"] for e in events}
        said = [e for e in events if e["event"] == "line" and e["text"] == AWKWARD]
        assert said and said[0]["instance"] in ("worker-0", "worker-1") and said[0]["job_id"] == job_id
        assert follow.decisions()[-1]["kind"] == "complete_job"

        # A valid change: the site's rule (a higher priority) judges the same failure not retryable.
        (rules / "60-site.yaml").write_text(SITE_RULE)
        said = _hup_and_wait(services, "processor", "rules reloaded")
        assert f"{len(list(rules.glob('*.yaml')))} files" in said, said
        assert services.alive()["processor"]
        follow = _glitch_job(services, job_id + "-b", json_flag="-o json")
        assert follow.finish(services) == 1, services.logs() + follow.stderr
        final = follow.decisions()[-1]
        assert (final["kind"], final["classifier"], final["category"]) == ("fail_job", "site_disk_glitch",
                                                                             "site_storage"), final

        # An invalid change is refused with file:line, and the previous rules stay.
        (rules / "61-broken.yaml").write_text(BROKEN_RULE)
        said = _hup_and_wait(services, "processor", "rules not reloaded")
        assert f"{rules / '61-broken.yaml'}:6" in said and "previous rules stay" in said, said
        assert len([line for line in said.splitlines() if "rules not reloaded" in line]) == 1
        follow = _glitch_job(services, job_id + "-c")
        assert follow.finish(services) == 1, services.logs() + follow.stderr
        assert follow.decisions()[-1]["classifier"] == "site_disk_glitch"
        assert services.alive() == {name: True for name in services.procs}, services.logs()

        # nodes: an unknown node is refused with the names of the known ones; a known one is isolated.
        refused = subprocess.run([*TRAINWARDEN, "nodes", "uncordon", "no-such-node", "--listen", "2"],
                                 env=services.env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert "no node named 'no-such-node' is known to the cluster" in refused.stderr
        assert all(node in refused.stderr for node in services.node_names), refused.stderr
        assert "Traceback" not in refused.stderr
        listed = subprocess.run([*TRAINWARDEN, "nodes", "--json"], env=services.env, cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
        assert "no-such-node" not in listed.stdout and services.node_names[0] in listed.stdout, listed.stdout
        for action in ("isolate", "uncordon"):
            done = subprocess.run([*TRAINWARDEN, "nodes", action, services.node_names[0]], env=services.env,
                                  cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
    finally:
        services.stop()


def _held(queue: Path) -> list[dict]:
    entries = [json.loads(p.read_text()) for p in (queue / "pending").glob("*.json")]
    return [e for e in entries if e["held"]]


def _window_message_sent(hook, held: dict) -> bool:
    """The held message was sent, or a later job.restarted of the same job that
    took its place in the window and counts it among the suppressed. The second
    happens when an agent's SIGTERM stops an instance (exit 143) and the processor
    decides one more restart before it stops itself: the first notifier has
    stopped by then, and the next one reads that decision."""
    for request in hook.requests:
        if request.webhook_id == held["event_id"]:
            return True
        data = json.loads(request.body).get("data", {})
        if (data.get("job_id") == held["job_id"] and data.get("round", -1) > json.loads(held["body"])["data"]["round"]
                and data.get("suppressed_count", 0) >= 1):
            return True
    return False


def test_every_service_stops_within_5_s_of_sigterm_the_notifier_with_a_held_message_that_stays_queued(
        bootstrap, tmp_path, job_id, receiver):  # noqa: F811 - fixtures
    hook = receiver()
    services = ServiceProcesses(bootstrap, tmp_path, metrics=True)
    try:
        # A window long enough for the SIGHUP and SIGTERM below on a loaded machine: the message must still be held.
        directory = _notifications(tmp_path, hook.url, rate=60)
        _start_notifier(services, directory)
        wait_for(lambda: _all_ready(services), 60, "every service ready")
        # Two restarts inside the window: the second job.restarted is held until it ends.
        proc = services.submit("--job-id", job_id, "--nproc", "2", "--args",
                               "--enable-job-restart=True --max-num-of-job-restart=5",
                               "--", *behave("--steps", "3000", "--step-s", "0.05", "--fail-rank", "1",
                                             "--fail-rounds", "0,1", "--fail-at-step", "2", "--fail-message",
                                             "RuntimeError: NCCL error: unhandled system error"))
        queue = services.tmp / "notify-queue"
        wait_for(lambda: _held(queue), 60, "a rate-limited job.restarted held in the queue")
        held = _held(queue)
        assert [e["event_type"] for e in held] == ["job.restarted"], held
        assert proc.poll() is None, "the job runs on while the services are stopped"
        # And a job that ignores SIGTERM: its agent must not wait out the job's grace period.
        stubborn = services.submit("--job-id", job_id + "-stubborn", "--", sys.executable, "-c", STUBBORN)
        wait_for(lambda: any((services.tmp / f"logs-{n}" / (job_id + "-stubborn")).exists()
                             for n in services.node_names), 60, "the SIGTERM-ignoring job printing")

        # SIGHUP stops no service: the processor and the notifier reload, the others ignore it.
        for proc_ in services.procs.values():
            proc_.send_signal(signal.SIGHUP)
        wait_for(lambda: "subscriptions reloaded" in (services.tmp / "notifier.log").read_text(), 20,
                 "the notifier's reload")
        time.sleep(1.0)
        assert services.alive() == {name: True for name in services.procs}, services.logs()
        assert [e["delivery_id"] for e in _held(queue)] == [e["delivery_id"] for e in held]
        wait_for(lambda: _all_ready(services), 20, "every service ready after the SIGHUP")

        stopped: dict[str, float] = {}
        started = time.monotonic()
        for proc_ in services.procs.values():
            proc_.send_signal(signal.SIGTERM)
        while len(stopped) < len(services.procs) and time.monotonic() - started < 15:
            for name, proc_ in services.procs.items():
                if name not in stopped and proc_.poll() is not None:
                    stopped[name] = time.monotonic() - started
            time.sleep(0.02)
        assert len(stopped) == len(services.procs), (stopped, services.logs())
        slow = {name: round(t, 2) for name, t in stopped.items() if t >= 5.0}
        assert not slow, (stopped, services.logs())
        assert all(p.returncode == 0 for p in services.procs.values()), services.logs()
        print("stop times (s):", {name: round(t, 2) for name, t in stopped.items()})
        for follower in (proc, stubborn):
            follower.kill()
            follower.wait(10)

        # Nothing accepted is lost: the held message is still on disk, and the next notifier sends it; or a
        # later job.restarted of the job took its place in the window and counts it among the suppressed (the
        # processor's decision after an agent's SIGTERM stopped an instance, see _window_message_sent).
        after = _held(queue)
        assert len(after) == 1 and (after[0]["delivery_id"] == held[0]["delivery_id"] or (
            after[0]["job_id"] == held[0]["job_id"] and after[0]["event_type"] == held[0]["event_type"]
            and after[0].get("suppressed", 0) >= held[0].get("suppressed", 0) + 1)), (held, after, services.logs())
        _start_notifier(services, directory)
        try:
            wait_for(lambda: _window_message_sent(hook, held[0]), 120,
                     "the held job.restarted (or the later one that replaced it) delivered by the next notifier")
        except AssertionError as exc:
            pending = [json.loads(p.read_text()) for p in (queue / "pending").glob("*.json")]
            raise AssertionError(f"{exc}\nheld: {held}\npending now: {pending}\nreceived: "
                                 f"{[r.webhook_id for r in hook.requests]}\n{services.logs()}") from None
    finally:
        services.stop()
