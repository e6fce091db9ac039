"""Poison records in a job's partition on a real Kafka broker
(TRAINWARDEN_KAFKA): they are dead-lettered, and a processor killed and
restarted afterwards replays the partition past them and finishes the job."""

import json
import time

import pytest

from trainwarden.bus import open_bus
from tests.cluster.processes import ServiceProcesses, behave, wait_for
from tests.cluster.test_cluster_kafka import _done, _finish, _node_running

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
POISON = (b"not json at all \xff\xfe",
          b'{"v":1,"type":"instance_exited","x":' + b"[" * 10000 + b"]" * 10000 + b"}",
          b'{"v":1,"type":"instance_exited","job_id":"%s"}')  # valid JSON, a required field missing


def _letters(bootstrap, services, job_id) -> list[dict]:
    consumer = open_bus(bootstrap).consumer([services.topic("deadletter")], None, from_beginning=True)
    try:
        return [json.loads(r.value) for r in consumer.poll(1.0, 10_000) if r.key == job_id or
                job_id.encode() in r.value]
    finally:
        consumer.close()


def test_a_processor_restarted_over_poison_records_in_its_partition_replays_past_them_and_finishes_the_job(
        bootstrap, tmp_path, job_id):  # noqa: F811 - fixture
    services = ServiceProcesses(bootstrap, tmp_path)
    try:
        proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--",
                               *behave("--steps", "100", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0",
                                       "--fail-at-step", "5", "--fail-message", NCCL))
        wait_for(lambda: _node_running(services, job_id, "worker-1", 1), 90, "round 1")
        producer = open_bus(bootstrap).producer()
        for value in POISON:  # keyed by the job: the partition of its events
            producer.send(services.topic("events"), job_id, value.replace(b"%s", job_id.encode()))
        producer.flush()
        producer.close()
        wait_for(lambda: sum(1 for letter in _letters(bootstrap, services, job_id)
                             if letter["service"] == "processor") >= len(POISON), 60,
                 "the processor's dead letters for the poison records")

        services.kill("processor")
        time.sleep(1.0)
        services.start("processor")
        _finish(services, proc)
        assert [(r["action"], r["round"]) for r in _done(services, job_id)] == [("restart_job", 0)]
        letters = [letter for letter in _letters(bootstrap, services, job_id) if letter["service"] == "processor"]
        # Each was dead-lettered by the first processor; the successor replays what
        # was committed without a word and takes what was not (delivery is at least
        # once), so a record has one dead letter, or two when the kill came first.
        per_offset = {}
        for letter in letters:
            per_offset[letter["offset"]] = per_offset.get(letter["offset"], 0) + 1
        assert len(per_offset) == len(POISON) and set(per_offset.values()) <= {1, 2}, letters
        assert {"not a JSON object", "nested too deeply", "missing required field"} <= {
            next((k for k in ("not a JSON object", "nested too deeply", "missing required field")
                  if k in letter["error"]), letter["error"]) for letter in letters}, letters
        assert all(services.alive().values()), services.logs()
    finally:
        services.stop()
