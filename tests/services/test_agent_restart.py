"""An agent that restarts within the node timeout is not lost, and the
actuator hears it as a new run (``Heartbeat.run``): the instances placed on
its node that the new run does not report are lost at once (the agents'
own instances die with their agent), those it reports are kept. On a real
broker: tests/cluster/test_takeover_kafka.py."""

from __future__ import annotations

from trainwarden.bus import DECISIONS, EVENTS, NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Heartbeat, RunningInstance
from trainwarden.bus.serde import decode, encode
from trainwarden.events import Decision, DecisionKind, InstanceSpec, JobSpec, NodeLost, Reason, RoleSpec
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.store import SpoolWriter

T0 = 1_800_000_000.0
JOB = "restarting-agent"
SPEC = JobSpec(roles=(RoleSpec("worker", 2, ("python", "train.py")),), stop_grace_s=3.0)
START = Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="submit", job_id=JOB, time=T0,
                 round=0, action_id="start-1", starts=(("worker-0", 0), ("worker-1", 0)), spec=SPEC,
                 instances=(InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1)),
                 detected_at=T0)


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


def _lost_after_the_agent_of_n1_beats(tmp_path, run: str, keeps: bool) -> list[NodeLost]:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    clock = Clock()
    producer = bus.producer()
    events = bus.consumer([EVENTS], None, from_beginning=True)
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), node_timeout_s=10.0, clock=clock)
    placed: dict[str, str] = {}

    def beat(node: str, node_run: str) -> None:
        running = tuple(RunningInstance(JOB, name, 0, 0, 100) for name, where in placed.items() if where == node)
        producer.send(NODES, node, encode(Heartbeat(node=node, time=clock.now, slots=1, running=running,
                                                    run=node_run)))
        producer.flush()

    beat("n1", "first")
    beat("n2", "only")
    service.run_once(0.0)
    producer.send(DECISIONS, JOB, encode(START))
    producer.flush()
    for _ in range(8):  # the start placed on the nodes heard (one slot each), and their agents reporting it
        service.run_once(0.0)
        placed = {name: node for name, node in service.cluster.placement.get(JOB, {}).items()}
        clock.now += 0.5
        beat("n1", "first")
        beat("n2", "only")
    assert sorted(placed.values()) == ["n1", "n2"], placed
    events.poll(0.0, max_records=1000)  # what came before the restart
    if not keeps:
        placed = {name: node for name, node in placed.items() if node != "n1"}
    beat("n1", run)
    service.run_once(0.0)
    service.close()
    return [m for m in (decode(EVENTS, r.value) for r in events.poll(0.0, max_records=1000))
            if isinstance(m, NodeLost)]


def test_a_restarted_agent_without_its_instance_has_that_instance_lost_at_once(tmp_path):
    [lost] = _lost_after_the_agent_of_n1_beats(tmp_path, "second", keeps=False)
    assert (lost.job_id, lost.node, len(lost.instances)) == (JOB, "n1", 1)


def test_a_restarted_agent_that_reports_its_instance_keeps_it(tmp_path):
    assert _lost_after_the_agent_of_n1_beats(tmp_path, "second", keeps=True) == []


def test_the_same_run_of_an_agent_beating_without_an_instance_loses_nothing(tmp_path):
    # An instance not yet reported (its start on the way) is no loss: only a new run says what died.
    assert _lost_after_the_agent_of_n1_beats(tmp_path, "first", keeps=False) == []
