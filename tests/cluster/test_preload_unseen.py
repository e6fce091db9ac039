"""Standbys (``submit --preload``) on the agents of a real Kafka cluster are
never instances: not in ``trainwarden nodes``, not in the history, not in
hang detection, and none is left once the job has ended."""

import json
import subprocess
import time

import pytest

from tests.cluster.processes import behave, services_on_broker, wait_for
from tests.e2e.helpers import standby_pids
from tests.conftest import TRAINWARDEN

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


@pytest.fixture
def services(tmp_path):
    yield from services_on_broker(tmp_path, nodes=2, slots=2)


def test_standbys_on_the_agents_are_in_no_listing_history_or_hang_detection_and_end_with_the_job(services, job_id):
    # Rank 1 is killed in round 0; round 1 runs 12 s of steps, while the
    # spares wait in silence far longer than the 3 s hang interval.
    proc = services.submit("--job-id", job_id, "--nproc", "2", "--preload", "json,email.mime.text", "--args",
                           "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=3",
                           "--", *behave("--steps", "60", "--step-s", "0.2", "--fail-rank", "1", "--fail-rounds", "0",
                                         "--fail-at-step", "2", "--fail-code", "137"))
    wait_for(lambda: len(standby_pids(job_id)) >= 2, 60, "the spares of round 1")
    listed = subprocess.run([*TRAINWARDEN, "nodes", "--json"], env=services.env, capture_output=True, text=True,
                            timeout=60)
    rows = {row["node"]: row for row in json.loads(listed.stdout)}
    assert sum(rows[node]["running"] for node in services.node_names) <= 2, rows
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, services.logs() + out[-3000:] + err[-3000:]
    assert "ordinary process" not in out + err
    records = [r for r in services.history(job_id) if r["result"] == "done"]
    assert [(r["action"], r["error_source"]) for r in records] == [("restart_job", "instance_exit")], records
    assert {r["instance_name"] for r in records} <= {"worker-0", "worker-1"}
    # The job ended: so did its standbys, on every agent.
    deadline = time.monotonic() + 15
    while standby_pids(job_id):
        assert time.monotonic() < deadline, standby_pids(job_id)
        time.sleep(0.2)
