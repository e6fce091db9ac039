"""The distributed services on the in-process bus: agents, processor and
actuator as in production, with real instance processes."""

import sys
import time

import pytest

from trainwarden.bus.memory import MemoryBus
from trainwarden.events import DecisionKind
from trainwarden.jobspec import from_command
from trainwarden.store import open_reader
from tests.cluster.harness import LocalCluster
from tests.e2e.helpers import BEHAVE

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(MemoryBus(), tmp_path)
    yield c
    c.stop()
    assert c.errors() == []


def _job(job_id, args, *behave, nproc=2):
    return from_command([sys.executable, BEHAVE, *behave], nproc, args, job_id, stop_grace_s=1)


def _faults(cluster, job_id):
    with open_reader(cluster.store) as reader:
        return [r for r in reader.faults(job_id) if r["result"] == "done"]


def test_a_sync_job_spread_over_nodes_survives_a_retryable_crash(cluster, job_id):
    outcome, lines, decisions = cluster.run(_job(job_id, "--enable-job-restart=True", "--fail-rank", "1",
                                                 "--fail-rounds", "0", "--fail-message", NCCL, "--steps", "5"))
    assert outcome is not None and outcome.kind is DecisionKind.COMPLETE_JOB, decisions
    starts = {name: a.service.counters.starts for name, a in cluster.agents.items()}
    assert sum(starts.values()) == 4 and sum(1 for n in starts.values() if n) >= 2, starts
    assert [line.text for line in lines if line.text.startswith("hello worker-1")][-1].startswith(
        "hello worker-1 rank=1 round=1 start=1")
    [fault] = _faults(cluster, job_id)
    assert fault["action"] == "restart_job" and fault["instance_name"] == "worker-1" and fault["node_name"]


def test_a_hung_job_spread_over_nodes_is_restarted(cluster, job_id):
    outcome, lines, decisions = cluster.run(_job(
        job_id, "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=2",
        "--hang-rank", "all", "--hang-at-step", "1", "--hang-rounds", "0", "--steps", "4"))
    assert outcome is not None and outcome.kind is DecisionKind.COMPLETE_JOB, decisions
    [fault] = _faults(cluster, job_id)
    assert fault["error_source"] == "hang"


@pytest.fixture
def kafka_cluster(tmp_path):
    import os
    import uuid

    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    from trainwarden.bus.kafka import KafkaBus

    c = LocalCluster(KafkaBus(bootstrap, client_id=f"test-{uuid.uuid4().hex[:6]}"), tmp_path)
    yield c
    c.stop()
    assert c.errors() == []


@pytest.mark.kafka
def test_the_same_services_over_a_real_kafka_broker_survive_a_retryable_crash(kafka_cluster, job_id):
    outcome, lines, decisions = kafka_cluster.run(_job(job_id, "--enable-job-restart=True", "--fail-rank", "1",
                                                       "--fail-rounds", "0", "--fail-message", NCCL, "--steps", "5"))
    assert outcome is not None and outcome.kind is DecisionKind.COMPLETE_JOB, decisions
    [fault] = _faults(kafka_cluster, job_id)
    assert fault["action"] == "restart_job" and fault["instance_name"] == "worker-1"
