"""The actuator records every node state change in the history's node_events,
once per change however often its state topic is read."""

from __future__ import annotations

from trainwarden.bus import NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Heartbeat
from trainwarden.bus.serde import encode
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.store import SpoolWriter
from trainwarden.store.embedded import EmbeddedStore

T0 = 1_800_000_000.0


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


def _events(store):
    return [(r["node_name"], r["state"], r["detail"]) for r in EmbeddedStore(store).select(
        "SELECT node_name, state, detail FROM node_events FINAL ORDER BY time, state")]


def test_isolation_loss_and_return_of_a_node_are_recorded_once_each_even_after_an_actuator_restart(tmp_path):
    store = tmp_path / "store"
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(store), node_timeout_s=5.0, clock=clock)
    beats = bus.producer()
    beats.send(NODES, "gpu-1", encode(Heartbeat(node="gpu-1", time=clock.now, slots=4, address="127.0.0.1")))
    service.run_once(0.0)
    clock.now += 1
    service.isolate("gpu-1", True, "c4d_error")
    service.run_once(0.0)
    clock.now += 1
    service.isolate("gpu-1", False, "uncordoned by an operator")
    service.run_once(0.0)
    service.run_once(0.0)
    service.close()
    expected = [("gpu-1", "isolated", "c4d_error"), ("gpu-1", "ready", "uncordoned by an operator")]
    assert _events(store) == expected
    # A new actuator replays the state topic: the same changes, no new rows.
    again = ActuatorService(bus, SpoolWriter(store), node_timeout_s=5.0, clock=clock)
    again.run_once(0.0)
    again.close()
    assert _events(store) == expected


def test_an_isolated_node_that_is_lost_comes_back_isolated_also_for_a_restarted_actuator(tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    clock = Clock()
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    beats = bus.producer()

    def beat():
        beats.send(NODES, "gpu-1", encode(Heartbeat(node="gpu-1", time=clock.now, slots=4, address="127.0.0.1")))

    beat()
    service.run_once(0.0)
    service.isolate("gpu-1", True, "c4d_error")
    service.run_once(0.0)
    # Past the fresh actuator's wait: the heartbeat is dated by the actuator's clock (runtime/nodes.py).
    clock.now += 6
    service.run_once(0.0)
    clock.now += 20  # silent past the timeout: lost (the loss is written to the state topic and read back)
    service.run_once(0.0)
    service.run_once(0.0)
    assert service.cluster.nodes["gpu-1"].status.value == "lost"
    beat()
    service.run_once(0.0)
    assert service.cluster.nodes["gpu-1"].status.value == "isolated"
    service.close()
    again = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=5.0, clock=clock)
    assert again.cluster.nodes["gpu-1"].isolated
    again.close()
