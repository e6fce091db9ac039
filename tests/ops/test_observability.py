"""The services' operating surface without a broker: the metrics endpoint and
its health and readiness answers, consumer lag, the log formats, flags and
their environment variables, and SIGHUP/SIGTERM of a notifier on the
in-process bus."""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from trainwarden.bus.memory import MemoryBus
from trainwarden.cli.main import _join_args_value, build_parser
from trainwarden.notify import MemoryDeliveryLog, Notifier, load_subscriptions, sample_event
from trainwarden.services.logs import ServiceLog
from trainwarden.services.observability import Address, Observer, parse_address, store_writable
from tests.cluster.processes import free_port, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from tests.ops.support import get
from tests.notify.conftest import ENV, receiver, subscription_yaml  # noqa: F401 - fixture
from tests.notify.receiver import HANG

CLUSTER_COMMANDS = ("agent", "processor", "actuator", "notifier", "submit", "nodes")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served():
    servers = []

    def serve(observer: Observer):
        servers.append(observer.serve_http(Address("127.0.0.1", free_port())))
        return f"http://127.0.0.1:{servers[-1].address.port}"

    yield serve
    for server in servers:
        server.close()


def test_health_says_whether_the_loop_ran_recently_and_readiness_names_what_is_missing(served, tmp_path):
    clock = Clock()
    observer = Observer("processor", clock=clock, stale_after_s=60)
    url = served(observer)
    assert get(url + "/healthz") == (503, "starting: the service loop has not run yet\n")
    assert get(url + "/readyz")[0] == 503
    observer.loop_ran()
    assert get(url + "/healthz") == (200, "ok\n")
    assert get(url + "/readyz") == (200, "ready\n")
    observer.loop_ran("polling Kafka failed: NoBrokersAvailable.")
    assert get(url + "/readyz") == (503, "the bus: polling Kafka failed: NoBrokersAvailable.\n")
    assert get(url + "/healthz")[0] == 200  # alive, only not ready
    observer.loop_ran()
    blocked = tmp_path / "store"
    blocked.mkdir()
    (blocked / "spool").write_text("a file where the spool directory belongs")
    observer.readiness_check(lambda: store_writable(str(blocked)))
    status, text = get(url + "/readyz")
    assert status == 503 and text.startswith(f"the history store's spool {blocked / 'spool'} is not writable")
    assert text.count("\n") == 1
    clock.now += 61
    assert get(url + "/healthz") == (503, "the service loop has not run for 61 s\n")
    assert get(url + "/nope")[0] == 404


def test_metrics_show_the_service_counters_read_at_scrape_time_and_the_consumer_lag(served):
    from dataclasses import dataclass

    @dataclass
    class Counters:
        lines: int = 0
        dead_letters: int = 0

    counters = Counters()
    observer = Observer("agent")
    observer.watch(lambda: counters, [("agent_slots", "slots", lambda: 8)])
    bus = MemoryBus()
    bus.create_topics([])
    for i in range(5):
        bus.append("t", "job", b"x")
    consumer = observer.bus(bus).consumer(["t"], "g", from_beginning=True)
    while not consumer.ready():
        consumer.poll(0.01)
    taken = consumer.poll(0.1, max_records=2)
    assert len(taken) == 2
    url = served(observer)
    counters.lines = 41
    text = get(url + "/metrics")[1]
    assert "trainwarden_agent_lines_total 41.0" in text
    assert "trainwarden_agent_dead_letters_total 0.0" in text
    assert "trainwarden_agent_slots 8.0" in text
    lag = [line for line in text.splitlines() if line.startswith("trainwarden_consumer_lag{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in lag) == 3.0, lag
    assert 'trainwarden_build_info{component="agent",version="' in text


@pytest.mark.parametrize("text,address", [("0.0.0.0:9464", Address("0.0.0.0", 9464)),
                                          (":9464", Address("0.0.0.0", 9464)),
                                          ("[::1]:9464", Address("::1", 9464)),
                                          ("localhost:1", Address("localhost", 1))])
def test_metrics_addresses(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["nonsense", "host:", "host:http", "host:0", "host:70000", ""])
def test_bad_metrics_addresses_are_refused(text):
    with pytest.raises(ValueError):
        parse_address(text)


def test_json_logs_carry_time_level_component_and_job_and_keep_job_text_as_data():
    out = io.StringIO()
    log = ServiceLog("actuator", "json", stream=out)
    awkward = 'line one\nline "two" \\ {"level": "forged"}'
    log("warning", awkward, job_id='job "x"\n')
    log("health", "healthy; decisions 3")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == awkward and first["job_id"] == 'job "x"\n'
    assert (first["level"], first["component"]) == ("warning", "actuator")
    assert first["time"].endswith("Z") and first["time"][:4].isdigit()
    assert (second["level"], second["job_id"]) == ("info", "")


def test_text_logs_are_one_line_per_record_with_time_level_component_and_job():
    out = io.StringIO()
    log = ServiceLog("processor", "text", stream=out)
    log("error", "rules not reloaded:\nbad.yaml:3: unknown key", job_id="j-1")
    (line,) = out.getvalue().splitlines()
    stamp, level, rest = line.split(" ", 2)
    assert stamp.endswith("Z") and level == "ERROR"
    assert rest == "processor job=j-1: rules not reloaded:\\nbad.yaml:3: unknown key"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_option_of_the_service_submit_and_nodes_commands_has_help_an_environment_variable_and_examples():
    commands = _subparsers(build_parser())
    for name in CLUSTER_COMMANDS:
        parser = commands[name]
        assert parser.epilog and parser.epilog.startswith("examples:\n  trainwarden"), name
        assert f"trainwarden {name}" in parser.epilog or name == "notifier", parser.epilog
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest} has no help"
            if action.option_strings:
                # The engines' own variables count: Slurm's SLURM_CONF, Kubernetes' KUBECONFIG.
                assert any(f"[env {name}" in action.help for name in ("TRAINWARDEN_", "SLURM_CONF]", "KUBECONFIG]")), \
                    f"{name} {action.option_strings[0]}: {action.help}"
    for name in ("agent", "processor", "actuator", "notifier"):
        options = {o for a in commands[name]._actions for o in a.option_strings}
        assert {"--metrics-address", "--log-format", "--bootstrap"} <= options, name


@pytest.mark.parametrize("name", CLUSTER_COMMANDS)
def test_the_examples_in_the_help_of_the_cluster_commands_parse(name):
    epilog = _subparsers(build_parser())[name].epilog
    checked = 0
    for line in epilog.split("\n\n")[0].split("\n")[1:]:  # the examples: the --args flags follow
        words = shlex.split(line.split("|")[0], comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # VARIABLE=value before the command
        if not words or words[0] != "trainwarden":
            continue  # kill -HUP PID
        argv = words[1:]
        if "--" in argv:
            argv = argv[:argv.index("--")]  # the job's command
        try:
            build_parser().parse_args(_join_args_value(argv))
        except SystemExit as exc:
            pytest.fail(f"the example {line!r} does not parse (exit {exc.code})")
        checked += 1
    assert checked >= 2, epilog


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"), **(env or {}))
    full.pop("TRAINWARDEN_KAFKA", None)
    return subprocess.run([*TRAINWARDEN, *args], env=full, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _one_sentence_and_a_hint(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("trainwarden: error:") and lines[1].startswith("hint:"), lines
    assert "Traceback" not in result.stderr
    return lines[0]


def test_bad_values_of_flags_and_of_their_environment_variables_are_refused_naming_the_flag():
    assert "--metrics-address" in _one_sentence_and_a_hint(_cli("processor", "--metrics-address", "nonsense"))
    assert "--metrics-address" in _one_sentence_and_a_hint(
        _cli("agent", "--bootstrap", "memory", env={"TRAINWARDEN_METRICS_ADDRESS": "nonsense"}))
    assert "--slots" in _one_sentence_and_a_hint(_cli("agent", env={"TRAINWARDEN_SLOTS": "many"}))
    assert "--log-format" in _one_sentence_and_a_hint(_cli("processor", "--log-format", "xml"))
    assert "--log-format" in _one_sentence_and_a_hint(_cli("actuator", env={"TRAINWARDEN_LOG_FORMAT": "xml"}))
    assert "$TRAINWARDEN_FOLLOW" in _one_sentence_and_a_hint(
        _cli("submit", "--bootstrap", "memory", "--", "true", env={"TRAINWARDEN_FOLLOW": "maybe"}))
    assert "disagree" in _one_sentence_and_a_hint(_cli("submit", "--json", "-o", "text", "--", "true"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_sentence_and_a_hint(_cli("processor", "--bootstrap", "memory", "--metrics-address",
                                             f"127.0.0.1:{port}"))
    assert f"--metrics-address 127.0.0.1:{port}: cannot listen there" in line


def _notifier_env(tmp_path: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"), TRAINWARDEN_STORE=str(tmp_path / "store"), **ENV)


def test_sighup_reloads_the_notifiers_subscriptions_refuses_an_invalid_change_and_sigterm_stops_it_quickly(tmp_path):
    directory = tmp_path / "notifications"
    directory.mkdir()
    one = "version: 1\nsubscriptions:\n" + subscription_yaml("ops", "https://hooks.example.com/a")
    (directory / "ops.yaml").write_text(one)
    port = free_port()
    log_path = tmp_path / "notifier.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*TRAINWARDEN, "notifier", "--bootstrap", "memory", "--notifications",
                                 str(directory), "--notify-dir", str(tmp_path / "queue"), "--metrics-address",
                                 f"127.0.0.1:{port}", "--log-format", "json"],
                                env=_notifier_env(tmp_path), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        def records() -> list[dict]:
            return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]

        def said(text: str) -> list[dict]:
            return [r for r in records() if text in r["message"]]

        wait_for(lambda: said("running"), 30, "the notifier running")
        wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "the notifier ready")
        (directory / "ops.yaml").write_text(one + "    colour: red\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: said("subscriptions not reloaded"), 30, "the refusal")
        (refused,) = said("subscriptions not reloaded")
        assert refused["level"] == "error" and f"{directory / 'ops.yaml'}:" in refused["message"], refused
        assert "previous ones stay" in refused["message"]
        assert proc.poll() is None
        (directory / "ops.yaml").write_text(one + subscription_yaml("audit", "https://hooks.example.com/b"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: said("subscriptions reloaded from"), 30, "the reload")
        assert said("subscriptions reloaded from")[0]["message"].endswith(": 2")
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert all(r["component"] == "notifier" for r in records())
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 5
        assert said("stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_notifier_stops_within_5_s_of_sigterm_while_a_delivery_hangs_and_the_delivery_stays_queued(
        tmp_path, receiver):  # noqa: F811 - fixture
    hook = receiver(default=HANG)
    directory = tmp_path / "notifications"
    directory.mkdir()
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", hook.url, private=True, timeout=10))
    queue = tmp_path / "queue"
    queued = Notifier(load_subscriptions(directory), queue, writer=MemoryDeliveryLog(), env=ENV)
    assert queued.submit(sample_event("job.restarted")) == 1
    queued.close()
    with open(tmp_path / "notifier.log", "wb") as log:
        proc = subprocess.Popen([*TRAINWARDEN, "notifier", "--bootstrap", "memory", "--notifications",
                                 str(directory), "--notify-dir", str(queue)],
                                env=_notifier_env(tmp_path), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: hook.requests, 30, "the delivery under way")
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, (tmp_path / "notifier.log").read_text()
        took = time.monotonic() - started
        print(f"notifier with a delivery in flight stopped {took:.2f} s after SIGTERM")
        assert took < 5, f"stopped {took:.1f} s after SIGTERM"
        assert len(list((queue / "pending").glob("*.json"))) == 1  # sent again by the next notifier
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
