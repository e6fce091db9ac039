"""What the bus hands the processor is bounded too: a JobSubmitted of
100,000 instances, or of a 1 MB arguments string, sent straight to a real
processor on a real broker (no `submit` in between to check it), fails the
job at once as invalid, with a short message naming the limit; no state is
made for the instances, and the processor goes on serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.cluster.processes import free_port, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from tests.ops.support import get

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# Sends one JobSubmitted as a job's own process could (instances, arguments) and prints the decision it gets.
SEND_AND_WAIT = """\
import json, sys, time
from trainwarden.bus import DECISIONS, EVENTS, open_bus
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.events import Decision, InstanceSpec, JobSubmitted

job_id, count, args = sys.argv[1], int(sys.argv[2]), sys.argv[3] * int(sys.argv[4])
bus = open_bus()
decisions = bus.consumer([DECISIONS], None, from_beginning=True)
instances = tuple(InstanceSpec(name=f"worker-{i}", role="worker", index=i, rank=i) for i in range(count))
producer = bus.producer()
producer.send(EVENTS, job_id, encode(JobSubmitted(job_id=job_id, time=time.time(), framework="pytorch", args=args,
                                                  instances=instances)))
producer.flush(30)
sent = time.monotonic()
while time.monotonic() < sent + 120:
    for record in decisions.poll(0.5):
        try:
            decision = decode(DECISIONS, record.value)
        except DecodeError:
            continue
        if isinstance(decision, Decision) and decision.job_id == job_id:
            print(json.dumps({"kind": decision.kind.value, "reason": decision.reason.value,
                              "message": decision.error_message, "after_s": time.monotonic() - sent}))
            sys.exit(0)
sys.exit("no decision in 120 s")
"""


def _peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def processor(bootstrap, tmp_path):  # noqa: F811 - fixture
    env = {**os.environ, "TRAINWARDEN_KAFKA": bootstrap, "PYTHONPATH": str(ROOT / "pipeline"),
           "TRAINWARDEN_TOPIC_PREFIX": f"twt{uuid.uuid4().hex[:8]}"}
    subprocess.run([*TRAINWARDEN, "kafka", "init", "--partitions", "2"], env=env, cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    with (tmp_path / "processor.log").open("wb") as log:
        proc = subprocess.Popen([*TRAINWARDEN, "processor", "--metrics-address", f"127.0.0.1:{port}"], env=env,
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    proc.env = env
    try:
        wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 60, "the processor's loop")
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def _send(processor, job_id: str, instances: int, args: str, repeat: int = 1) -> dict:
    done = subprocess.run([sys.executable, "-c", SEND_AND_WAIT, job_id, str(instances), args, str(repeat)],
                          env=processor.env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_submission_of_100000_instances_fails_as_invalid_without_a_state_per_instance(processor, job_id):
    before_mb = _peak_rss_mb(processor.pid)
    decision = _send(processor, job_id, 100_000, "")
    assert decision["kind"] == "fail_job" and decision["reason"] == "invalid_job", decision
    assert decision["message"] == "the job has 100,000 instances; a job may have at most 16384", decision
    assert _peak_rss_mb(processor.pid) - before_mb < 100
    # Still serving: an ordinary job after it starts.
    assert _send(processor, job_id + "-next", 2, "")["kind"] == "start_job"


def test_a_submission_with_a_1_mb_arguments_string_fails_at_once_with_a_short_message(processor, job_id):
    decision = _send(processor, job_id, 2, "x", repeat=1_000_000)
    assert decision["kind"] == "fail_job" and decision["reason"] == "invalid_job", decision
    assert decision["message"].startswith("The arguments string is 1,000,000 characters long; it may be at most "
                                          "4,096 (it begins 'xxxxxxxx"), decision
    assert len(decision["message"]) < 300, decision
    assert decision["after_s"] < 10, decision
