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
    cluster.heartbeat(_beat("a", 100.0))
    cluster.set_isolated("a", True, "c4d_error")
    assert cluster.expire(104.0) == ["a"] and cluster.nodes["a"].status is NodeStatus.LOST
    assert cluster.heartbeat(_beat("a", 105.0)) is NodeStatus.ISOLATED


def test_a_leaving_agent_makes_its_node_lost_at_once():
    cluster = Cluster(node_timeout_s=30)
    cluster.heartbeat(_beat("a", 100.0))
    assert cluster.heartbeat(_beat("a", 101.0, leaving=True)) is NodeStatus.LOST
