"""A SIGHUP reload parses beside the service loop: while a slow reload of the
rules is still parsing, a real processor on a real broker goes on taking
events and publishing decisions; the new rules go in between two iterations
once parsed, and a reload that fails leaves the previous rules, counted.

The processor is the real `trainwarden processor` process; only its rules
loading is made slow: a reload's load parses the rules directory again and
again (real parsing, holding the interpreter as a large directory does) until
the test says it may end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.processes import free_port, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from tests.ops.support import get

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# The processor, with every load of the rules after the first one slow for as long as the test wants.
SLOW_RELOAD = """\
import pathlib, sys, time
import trainwarden.cli.cluster_cmd as cluster_cmd
from trainwarden.cli.main import main

gate = pathlib.Path(sys.argv[1])
real_load_rules = cluster_cmd.load_rules
loads = []

def slow_load_rules(directory=None):
    loads.append(directory)
    if len(loads) > 1:
        (gate / "parsing").touch()
        deadline = time.monotonic() + 120
        while not (gate / "release").exists() and time.monotonic() < deadline:
            real_load_rules(directory)
    return real_load_rules(directory)

cluster_cmd.load_rules = slow_load_rules
sys.exit(main(sys.argv[2:]))
"""


def _metrics(port: int) -> dict[str, float]:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return {}
    return {sample.name + (json.dumps(sample.labels, sort_keys=True) if sample.labels else ""): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_processor_keeps_taking_events_while_a_slow_reload_parses_then_swaps_the_rules_in(
        bootstrap, tmp_path, job_id):  # noqa: F811 - fixture
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests", "notifications"))
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "TRAINWARDEN_KAFKA": bootstrap, "PYTHONPATH": str(ROOT / "pipeline"),
           "TRAINWARDEN_TOPIC_PREFIX": f"twt{uuid.uuid4().hex[:8]}", "TRAINWARDEN_STORE": str(tmp_path / "store")}
    subprocess.run([*TRAINWARDEN, "kafka", "init", "--partitions", "2"], env=env, cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    log_path = tmp_path / "processor.log"
    with log_path.open("wb") as log:
        processor = subprocess.Popen(
            [sys.executable, "-c", SLOW_RELOAD, str(gate), "processor", "--rules", str(rules),
             "--metrics-address", f"127.0.0.1:{port}"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    said = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 60, "the processor's loop")

        processor.send_signal(signal.SIGHUP)
        wait_for((gate / "parsing").exists, 30, "the reload to start parsing")
        submitted = subprocess.run([*TRAINWARDEN, "submit", "--job-id", job_id, "--", "true"], env=env, cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        # The job's start decision is published while the reload still parses.
        wait_for(lambda: _metrics(port).get("trainwarden_processor_decisions_total", 0) >= 1, 60,
                 "the processor to decide while the reload parses")
        assert _metrics(port)["trainwarden_processor_events_total"] >= 1
        assert "rules reloaded" not in said() and not (gate / "release").exists()

        (gate / "release").touch()
        wait_for(lambda: "rules reloaded" in said(), 60, "the parsed rules to be swapped in")
        assert _metrics(port)['trainwarden_reloads_total{"outcome": "swapped"}'] == 1

        (rules / "90-broken.yaml").write_text("version: 1\nclassifiers:\n  - name: x\n    colour: red\n")
        processor.send_signal(signal.SIGHUP)
        wait_for(lambda: "rules not reloaded" in said(), 60, "the broken rules to be refused")
        assert "the previous rules stay: " + str(rules / "90-broken.yaml") + ":3: a classifier needs" in said()
        assert _metrics(port)['trainwarden_reloads_total{"outcome": "refused"}'] == 1
        assert processor.poll() is None, said()
    finally:
        (gate / "release").touch()
        processor.send_signal(signal.SIGTERM)
        try:
            processor.wait(30)
        except subprocess.TimeoutExpired:
            processor.kill()
            processor.wait(10)
    assert processor.returncode == 0, said()
