"""Takeover in seconds (issue 26, item 3), on a real broker whose consumer
sessions can be 2 s short (deploy/kafka/local-kafka's): a processor killed
mid-job is replaced by the survivor, and a restarted actuator carries out
what waited, within seconds; a hang due during a takeover is late by seconds
at most. Times are this test's own clock, from the kill (or the silence) to
the decision or the new round as the test sees them (tests/cluster/takeover.py).
The 3 s target is bench/takeover.py's figure on a quiet machine (2.2-2.3 s,
docs/PERFORMANCE.md); these tests hold a bound that still fails the 10 s
sessions they replaced (9.4-18 s) on CI's two loaded cores."""

from __future__ import annotations

import pytest

from tests.cluster.processes import ServiceProcesses
from tests.cluster.takeover import (
    Services,
    actuator_restart,
    agent_killed_as_its_rank_crashes,
    agent_restart,
    broker_outage,
    hang_during_takeover,
    processor_takeover,
    restartable_broker,
    short_session_broker,
    wait_for,
)

# Bounds of 3 s on a 2-core machine, and a broker outage every other test would see.
pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.alone]

TAKEOVER_S = 5.0  # the 3 s target plus what a loaded CI machine adds (3.0 s measured here at load 7)
HANG_INTERVAL_S = 5
NODE_TIMEOUT_S = 10.0
OUTAGE_S = 15  # the clients' reconnect backoff has grown to its cap by then


@pytest.fixture
def services(tmp_path):
    # The actuator's default node timeout: the grace a restarted agent has to report in.
    s = Services(short_session_broker(), tmp_path, nodes=2, node_timeout_s=NODE_TIMEOUT_S)
    s.start_second_processor()
    try:
        wait_for(s.settled, 60, "two processors holding two events partitions each")
        yield s
    finally:
        s.stop()


def test_a_processor_killed_mid_job_is_replaced_by_the_survivor_which_decides_within_seconds(services, job_id,
                                                                                             tmp_path):
    took = processor_takeover(services, job_id, tmp_path / "work")
    assert took <= TAKEOVER_S, f"the survivor decided {took:.1f} s after the kill\n{services.logs()}"


def test_a_hang_due_while_its_processor_is_taken_over_fires_seconds_late_at_most(services, job_id, tmp_path):
    silent = hang_during_takeover(services, job_id, tmp_path / "work", HANG_INTERVAL_S)
    assert silent <= HANG_INTERVAL_S + TAKEOVER_S, (
        f"the hang fired after {silent:.1f} s of silence (interval {HANG_INTERVAL_S} s)\n{services.logs()}")


def test_a_restarted_actuator_carries_out_a_restart_decided_while_it_was_dead_within_seconds(services, job_id,
                                                                                             tmp_path):
    took = actuator_restart(services, job_id, tmp_path / "work")
    assert took <= TAKEOVER_S, (f"the new round started {took:.1f} s after the actuator was killed", services.logs())


def test_an_agent_restarted_within_the_node_timeout_takes_its_instances_back_and_nothing_restarts(
        services, job_id, tmp_path):
    took, decisions = agent_restart(services, job_id, tmp_path / "work", node_timeout_s=NODE_TIMEOUT_S)
    restarts = [(d["kind"], d["error_source"]) for d in decisions if d["kind"] != "start_job"]
    # One restart, for the crash (its output and exit code came through the new agent), none for the node.
    assert len(restarts) == 1 and restarts[0][0] == "restart_job" and restarts[0][1] != "node_lost", restarts
    assert took <= TAKEOVER_S, (f"round 1 started {took:.1f} s after the crash", services.logs())


def test_a_rank_that_crashes_while_its_agent_is_down_is_restarted_once_when_the_agent_is_back(
        services, job_id, tmp_path):
    took, decisions = agent_killed_as_its_rank_crashes(services, job_id, tmp_path / "work")
    restarts = [(d["kind"], d["error_source"]) for d in decisions if d["kind"] != "start_job"]
    assert len(restarts) == 1 and restarts[0][0] == "restart_job" and restarts[0][1] != "node_lost", restarts
    # Acted on once the new run has joined its group and reported in (1-6 s
    # here): within the node timeout, by which the node would have been lost.
    assert took <= NODE_TIMEOUT_S, (f"round 1 started {took:.1f} s after the crash", services.logs())


def test_after_a_broker_outage_every_service_is_ready_and_a_crash_it_held_back_is_acted_on_within_seconds(
        job_id, tmp_path):
    bootstrap = short_session_broker()
    restartable_broker(bootstrap)
    services = ServiceProcesses(bootstrap, tmp_path, nodes=2, metrics=True, node_timeout_s=10.0)
    try:
        ready, acted = broker_outage(services, job_id, tmp_path / "work", OUTAGE_S)
        assert ready <= TAKEOVER_S, (f"the services were ready {ready:.1f} s after the broker", services.logs())
        assert acted <= TAKEOVER_S, (f"the crash was acted on {acted:.1f} s after the broker", services.logs())
    finally:
        services.stop()
