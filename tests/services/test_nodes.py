"""The actuator's cluster view: placement and node states."""

import pytest

from trainwarden.bus.messages import Heartbeat
from trainwarden.runtime.nodes import Cluster, NoCapacity, NodeStatus


def _beat(node, t, slots=2, leaving=False):
    return Heartbeat(node=node, time=t, slots=slots, leaving=leaving)


def test_a_node_known_only_from_the_state_topic_gets_no_instance():
    cluster = Cluster(node_timeout_s=3)
    cluster.set_isolated("ghost", False, "from an old state record")
    with pytest.raises(NoCapacity):
        cluster.place("j", "worker-0", now=100.0)


def test_placement_spreads_over_ready_nodes_and_respects_slots():
    cluster = Cluster(node_timeout_s=3)
    cluster.heartbeat(_beat("a", 100.0, slots=1))
    cluster.heartbeat(_beat("b", 100.0, slots=1))
    nodes = {cluster.place("j", f"worker-{i}", now=100.5).name for i in range(2)}
    assert nodes == {"a", "b"}
    with pytest.raises(NoCapacity):
        cluster.place("j", "worker-2", now=100.5)


def test_an_isolated_node_gets_no_instance_until_uncordoned():
    cluster = Cluster(node_timeout_s=3)
    cluster.heartbeat(_beat("a", 100.0))
    cluster.set_isolated("a", True, "c4d_error")
    with pytest.raises(NoCapacity):
        cluster.place("j", "worker-0", now=100.5)
    cluster.set_isolated("a", False, "uncordoned")
    assert cluster.place("j", "worker-0", now=100.5).name == "a"


def test_a_silent_node_is_lost_and_an_isolated_one_comes_back_isolated():
    cluster = Cluster(node_timeout_s=3)
    cluster.heartbeat(_beat("a", 100.0), arrived_at=100.0)
    cluster.set_isolated("a", True, "c4d_error")
    assert cluster.expire(104.0) == ["a"] and cluster.nodes["a"].status is NodeStatus.LOST
    assert cluster.heartbeat(_beat("a", 105.0), arrived_at=105.0) is NodeStatus.ISOLATED


@pytest.mark.parametrize("skew_s", [-3600.0, -4.0, 4.0, 3600.0])
def test_a_node_is_heard_when_its_heartbeat_arrives_whatever_its_agents_clock_says(skew_s):
    cluster = Cluster(node_timeout_s=3)
    for arrived in (100.0, 101.0, 102.0):
        cluster.heartbeat(_beat("a", arrived + skew_s), arrived_at=arrived)
        assert cluster.expire(arrived + 0.5) == []
    assert cluster.place("j", "worker-0", now=102.5).name == "a"
    assert cluster.expire(105.0) == []  # 3 s since the last one arrived: not yet
    assert cluster.expire(105.1) == ["a"]  # an agent ahead is not immortal, one behind not lost at once


def test_a_heartbeat_without_its_arrival_counts_from_the_next_time_the_view_is_given():
    cluster = Cluster(node_timeout_s=3)
    cluster.heartbeat(_beat("a", 100.0 - 3600))  # an agent an hour behind
    assert cluster.expire(200.0) == []  # arrived by now: heard now, not an hour ago
    cluster.heartbeat(_beat("b", 100.0 + 3600))  # an hour ahead
    assert cluster.place("j", "worker-0", now=201.0).name in ("a", "b")
    assert sorted(cluster.expire(204.5)) == ["a", "b"]


def test_a_leaving_agent_makes_its_node_lost_at_once():
    cluster = Cluster(node_timeout_s=30)
    cluster.heartbeat(_beat("a", 100.0))
    assert cluster.heartbeat(_beat("a", 101.0, leaving=True)) is NodeStatus.LOST


def test_where_an_incarnation_runs_follows_each_new_heartbeat():
    from trainwarden.bus.messages import RunningInstance

    cluster = Cluster(node_timeout_s=3)
    cluster.heartbeat(Heartbeat(node="b", time=1.0, slots=2, running=(RunningInstance("j", "worker-0", 0, 0, 10),)))
    cluster.heartbeat(Heartbeat(node="a", time=1.0, slots=2, running=(RunningInstance("j", "worker-0", 0, 0, 11),)))
    assert cluster.running_at("j", "worker-0", 0, 0) == ["a", "b"]
    assert cluster.running_at("j", "worker-0", 1, 0) == []
    cluster.heartbeat(Heartbeat(node="b", time=2.0, slots=2, running=(RunningInstance("j", "worker-0", 1, 0, 12),)))
    assert cluster.running_at("j", "worker-0", 0, 0) == ["a"]
    assert cluster.running_at("j", "worker-0", 1, 0) == ["b"]
