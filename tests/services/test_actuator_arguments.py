"""On the cluster a job whose arguments string does not parse never runs,
least of all on the default settings: the processor fails it as
``invalid_job`` naming the flag, and an actuator handed a start with such a
string anyway (from a processor of another version, say) refuses it the
same way: nothing starts, now or after the actuator restarts."""

from __future__ import annotations

from trainwarden.bus import COMMANDS, DECISIONS, EVENTS, NODES, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Heartbeat, StartInstance, StartInstances
from trainwarden.bus.serde import decode, encode
from trainwarden.events import Decision, DecisionKind, InstanceSpec, JobSpec, JobSubmitted, Reason, RoleSpec
from trainwarden.rules.loader import load_rules
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.services.processor import Processor
from trainwarden.store import SpoolWriter, open_reader

T0 = 1_800_000_000.0
JOB = "bad-args"
BAD_ARGS = "--enable-job-restart=True --no-such-flag=1"
SPEC = JobSpec(roles=(RoleSpec("worker", 2, ("python", "train.py")),), stop_grace_s=3.0)
INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _bus() -> MemoryBus:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    return bus


def _serve_actuator(service: ActuatorService, bus: MemoryBus, clock: Clock, seconds: float) -> None:
    """The actuator's iterations for ``seconds`` of its clock, with a node ready to run anything."""
    beats = bus.producer()
    end = clock.now + seconds
    while clock.now < end:
        beats.send(NODES, "node-a", encode(Heartbeat(node="node-a", time=clock.now, slots=4, address="127.0.0.1")))
        service.run_once(0.0)
        clock.now += 0.5


def _starts(bus: MemoryBus) -> list:
    commands = bus.consumer([COMMANDS], None, from_beginning=True)
    sent = [decode(COMMANDS, r.value) for r in commands.poll(0.0, max_records=1000)]
    commands.close()
    return [s for c in sent for s in (c.starts if isinstance(c, StartInstances) else (c,)) if isinstance(s, StartInstance)]


def _history(store) -> tuple[list[dict], list[dict]]:
    with open_reader(store) as reader:
        return reader.jobs(JOB), [d for d in reader.dead_letters(limit=100) if d["job_id"] == JOB]


def test_an_actuator_handed_a_start_whose_arguments_do_not_parse_starts_nothing_and_fails_the_job_naming_the_flag(
        tmp_path):
    bus, clock, store = _bus(), Clock(), tmp_path / "store"
    start = Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="job_submitted", job_id=JOB,
                     time=T0, round=0, action_id="start-1", spec=SPEC, instances=INSTANCES, args=BAD_ARGS,
                     detected_at=T0)
    bus.producer().send(DECISIONS, JOB, encode(start))
    service = ActuatorService(bus, SpoolWriter(store), node_timeout_s=5.0, clock=clock)
    _serve_actuator(service, bus, clock, 3.0)
    assert _starts(bus) == [] and JOB not in service.jobs, "the job was started on the default settings"
    assert service.counters.refused_starts == 1
    service.close()
    # A restarted actuator reads its state topic back: the refused start stays refused.
    again = ActuatorService(bus, SpoolWriter(store), node_timeout_s=5.0, clock=clock)
    _serve_actuator(again, bus, clock, 3.0)
    assert _starts(bus) == [] and JOB not in again.jobs and again.counters.refused_starts == 0
    again.close()
    [job], [letter] = _history(store)
    assert (job["status"], job["reason"], job["instances"]) == ("failed", "invalid_job", 2), job
    assert "--no-such-flag" in letter["error"] and "not run on the defaults" in letter["error"], letter
    assert letter["payload"] == BAD_ARGS


def test_a_submission_whose_arguments_do_not_parse_is_failed_by_the_processor_and_nothing_runs(tmp_path):
    bus, clock, store = _bus(), Clock(), tmp_path / "store"
    bus.producer().send(EVENTS, JOB, encode(JobSubmitted(job_id=JOB, time=T0, framework="pytorch", args=BAD_ARGS,
                                                         instances=INSTANCES, spec=SPEC)))
    processor = Processor(bus, load_rules(), clock=clock)
    for _ in range(3):
        processor.run_once(0.0)
    processor.close()
    decisions = bus.consumer([DECISIONS], None, from_beginning=True)
    [decision] = [m for m in (decode(DECISIONS, r.value) for r in decisions.poll(0.0, 100)) if isinstance(m, Decision)]
    assert (decision.kind, decision.reason) == (DecisionKind.FAIL_JOB, Reason.INVALID_JOB)
    assert "--no-such-flag" in decision.error_message, decision.error_message
    service = ActuatorService(bus, SpoolWriter(store), node_timeout_s=5.0, clock=clock)
    _serve_actuator(service, bus, clock, 3.0)
    service.close()
    assert _starts(bus) == []
    [job], _ = _history(store)
    assert (job["status"], job["reason"]) == ("failed", "invalid_job"), job
