"""The processor on the in-process bus: replay, dead letters, log lines."""

import json

from trainwarden.bus import DEAD_LETTERS, DECISIONS, EVENTS, LOGS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Line, LogBatch
from trainwarden.bus.serde import decode, encode
from trainwarden.events import DecisionKind, InstanceExited, InstanceStarted, JobSubmitted, Stream
from trainwarden.rules.loader import load_rules
from trainwarden.services.processor import Processor
from trainwarden.simulation.cluster import instance_specs

T0 = 1_800_000_000.0


def _bus() -> MemoryBus:
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    return bus


def _job(bus, job_id="j1", args="--enable-job-restart=True", lines=0):
    producer = bus.producer()
    producer.send(EVENTS, job_id, encode(JobSubmitted(job_id=job_id, time=T0, framework="pytorch", args=args,
                                                      instances=instance_specs([("worker", 2)]))))
    for name in ("worker-0", "worker-1"):
        producer.send(EVENTS, job_id, encode(InstanceStarted(job_id=job_id, time=T0, instance=name, round=0,
                                                             start=0, node="n")))
    if lines:
        producer.send(LOGS, job_id, encode(LogBatch(job_id=job_id, node="n", instance="worker-0", round=0, start=0,
                                                    lines=tuple(Line(T0 + i, Stream.STDOUT, f"step {i}")
                                                                for i in range(lines)))))
    return producer


def _decisions(bus, job_id="j1"):
    consumer = bus.consumer([DECISIONS], None, from_beginning=True)
    return [decode(DECISIONS, r.value) for r in consumer.poll(0.1, 10_000) if r.key == job_id]


def _dead_letters(bus) -> list[dict]:
    return [json.loads(r.value) for r in bus.consumer([DEAD_LETTERS], None, True).poll(0.1)]


def _drain(processor, times=5):
    """Iterations, each with a tick (the service loop's timing is tests/services/test_loop.py's)."""
    for _ in range(times):
        processor.run_once(timeout_s=0.01)
        processor.tick()


def test_log_lines_that_arrive_while_their_partition_replays_still_count():
    bus = _bus()
    _job(bus, lines=250)
    processor = Processor(bus, load_rules())
    _drain(processor)
    assert processor.counters.log_lines == 250
    assert processor.jobs["j1"].instances["worker-0"].tail[-1] == "step 249"


def test_a_successor_replays_without_publishing_a_decision_twice():
    bus = _bus()
    producer = _job(bus)
    first = Processor(bus, load_rules())
    _drain(first)
    producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 5, instance="worker-1", round=0,
                                                      start=0, exit_code=137, tail=("killed",))))
    _drain(first)
    first.close()
    second = Processor(bus, load_rules())
    _drain(second)
    kinds = [d.kind for d in _decisions(bus)]
    assert kinds == [DecisionKind.START_JOB, DecisionKind.RESTART_JOB]
    assert second.counters.replayed > 0 and second.jobs["j1"].round == 1


def test_a_decision_lost_between_deciding_and_recording_is_published_by_the_successor():
    bus = _bus()
    producer = _job(bus)
    producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 5, instance="worker-1", round=0,
                                                      start=0, exit_code=137, tail=("killed",))))
    # No processor ever saw these events: for a successor, their decisions are "lost".
    second = Processor(bus, load_rules())
    _drain(second)
    kinds = [d.kind for d in _decisions(bus)]
    assert kinds == [DecisionKind.START_JOB, DecisionKind.RESTART_JOB]
    assert second.counters.republished == 2


def test_a_malformed_event_goes_to_the_dead_letter_topic_and_processing_goes_on():
    bus = _bus()
    producer = _job(bus)
    processor = Processor(bus, load_rules())
    _drain(processor)
    producer.send(EVENTS, "j1", b'{"v":1,"type":"instance_exited","job_id":"j1"}')
    producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 5, instance="worker-1", round=0,
                                                      start=0, exit_code=137, tail=())))
    _drain(processor)
    letters = _dead_letters(bus)
    assert len(letters) == 1 and letters[0]["service"] == "processor" and "missing required field" in letters[0]["error"]
    assert [d.kind for d in _decisions(bus)][-1] is DecisionKind.RESTART_JOB


def test_an_event_nested_too_deeply_to_decode_is_dead_lettered_and_the_next_one_is_taken():
    bus = _bus()
    producer = _job(bus)
    processor = Processor(bus, load_rules())
    _drain(processor)
    producer.send(EVENTS, "j1", b'{"v":1,"type":"instance_exited","x":' + b"[" * 20000 + b"]" * 20000 + b"}")
    producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 5, instance="worker-1", round=0,
                                                      start=0, exit_code=137, tail=())))
    _drain(processor)
    letters = _dead_letters(bus)
    assert len(letters) == 1 and "nested too deeply" in letters[0]["error"], letters
    assert [d.kind for d in _decisions(bus)][-1] is DecisionKind.RESTART_JOB


def test_a_successor_replaying_a_partition_with_poison_records_skips_and_counts_them_and_finishes_the_job():
    bus = _bus()
    producer = _job(bus)
    first = Processor(bus, load_rules())
    _drain(first)
    producer.send(EVENTS, "j1", b"not json at all")
    producer.send(EVENTS, "j1", b'{"v":1,"type":"instance_exited","x":' + b"[" * 20000 + b"]" * 20000 + b"}")
    _drain(first)
    first.close()
    second = Processor(bus, load_rules())
    _drain(second)
    assert second.counters.replay_skipped == 2
    assert len(_dead_letters(bus)) == 2  # dead-lettered once, by the first
    for name in ("worker-0", "worker-1"):
        producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 9, instance=name, round=0,
                                                          start=0, exit_code=0, tail=())))
    _drain(second)
    assert second.jobs["j1"].finished



def test_a_successor_dead_letters_the_poison_records_no_processor_had_read_and_only_those():
    bus = _bus()
    producer = _job(bus)
    first = Processor(bus, load_rules())
    _drain(first)
    producer.send(EVENTS, "j1", b"read by the first")
    _drain(first)
    first.close()
    # While no processor owns the partition (the first is gone, or its
    # successor has not joined yet): nobody has dead-lettered these.
    producer.send(EVENTS, "j1", b"sent while no processor ran")
    producer.send(EVENTS, "j1", b'{"v":1,"type":"no_such_type"}')
    second = Processor(bus, load_rules())
    _drain(second)
    letters = _dead_letters(bus)
    assert sorted(letter["value"] for letter in letters) == [
        "read by the first", "sent while no processor ran", '{"v":1,"type":"no_such_type"}'], letters
    assert (second.counters.dead_letters, second.counters.replay_skipped) == (2, 1)


# ------------------------------------------------ where a line comes from


class _Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _batch(node: str, when: float, text: str, instance: str = "worker-0") -> bytes:
    return encode(LogBatch(job_id="j1", node=node, instance=instance, round=0, start=0,
                           lines=(Line(when, Stream.STDOUT, text),)))


def test_a_line_counts_only_from_the_node_that_runs_its_incarnation():
    bus = _bus()
    producer = _job(bus)
    clock = _Clock(T0)
    processor = Processor(bus, load_rules(), clock=clock)
    _drain(processor)
    clock.now = T0 + 1
    producer.send(LOGS, "j1", _batch("elsewhere", T0 + 1, "RuntimeError: NCCL error: unhandled system error"))
    _drain(processor)
    clock.now = T0 + 2
    producer.send(LOGS, "j1", _batch("n", T0 + 2, "step 1"))
    clock.now = T0 + 2  # lines are dated by their arrival, on the processor's clock
    _drain(processor)
    worker = processor.jobs["j1"].instances["worker-0"]
    # Dated by its arrival at the processor (its own clock), as every line is.
    assert list(worker.tail) == ["step 1"] and worker.last_output == T0 + 2
    assert (processor.counters.lines_from_other_nodes, processor.counters.log_lines) == (1, 1)


def test_lines_from_another_node_do_not_keep_a_hung_instance_alive():
    bus = _bus()
    producer = _job(bus, args="--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=5")
    clock = _Clock(T0)
    processor = Processor(bus, load_rules(), clock=clock)
    producer.send(LOGS, "j1", _batch("n", T0, "step 0"))
    producer.send(LOGS, "j1", _batch("n", T0, "step 0", instance="worker-1"))
    _drain(processor)
    for second in range(1, 10):  # the job hangs; someone keeps "printing" for worker-0, naming another node
        clock.now = T0 + second
        producer.send(LOGS, "j1", _batch("elsewhere", clock.now, "still alive"))
        _drain(processor)
    [hang] = [d for d in _decisions(bus) if d.kind is DecisionKind.RESTART_JOB]
    assert hang.reason.value == "job_hang" and hang.time == T0 + 5  # on time: 5 s after the last genuine line
    assert processor.counters.lines_from_other_nodes == 5  # then round 1 began: the rest are stale lines


def test_a_line_of_an_incarnation_not_yet_known_to_have_started_is_left_to_the_engine():
    bus = _bus()
    producer = bus.producer()
    producer.send(EVENTS, "j1", encode(JobSubmitted(job_id="j1", time=T0, framework="pytorch", args="",
                                                    instances=instance_specs([("worker", 1)]))))
    producer.send(LOGS, "j1", _batch("n", T0 + 1, "early line"))  # its InstanceStarted is still on its way
    processor = Processor(bus, load_rules())
    _drain(processor)
    assert processor.counters.lines_from_other_nodes == 0
    assert list(processor.jobs["j1"].instances["worker-0"].tail) == ["early line"]


def test_unsigned_lines_taken_for_vector_still_count_only_from_the_node_that_runs_the_instance():
    from trainwarden.bus.messages import WireLogLine
    from trainwarden.bus.signing import Keyring, SigningBus, SigningConfig

    memory = _bus()
    keyring = Keyring((("k1", b"k" * 32),))
    bus = SigningBus(memory, SigningConfig(keyring, accept_unsigned_logs=True), "processor", lambda: T0)
    _job(bus)  # the agents' events, signed
    processor = Processor(bus, load_rules())
    _drain(processor)
    plain = memory.producer()  # Vector: unsigned
    for node, text in (("n", "from its node"), ("m", "from another node")):
        plain.send(LOGS, "j1", encode(WireLogLine(job_id="j1", node=node, instance="worker-0", round=0, start=0,
                                                  time=T0 + 1, text=text)))
    _drain(processor)
    assert list(processor.jobs["j1"].instances["worker-0"].tail) == ["from its node"]
    assert processor.counters.lines_from_other_nodes == 1 and bus.counters.unsigned == 0


def test_events_read_in_the_same_batch_as_the_end_of_a_replay_are_taken_after_it_not_lost_as_of_an_unknown_job():
    bus = _bus()
    producer = _job(bus)
    processor = Processor(bus, load_rules())
    processor.run_once(timeout_s=0.01)  # assigned: the partition is to be replayed up to its end now
    for name in ("worker-0", "worker-1"):  # past that end, read in the batch that ends the replay
        producer.send(EVENTS, "j1", encode(InstanceExited(job_id="j1", time=T0 + 5, instance=name, round=0,
                                                          start=0, exit_code=0, tail=("done",))))
    _drain(processor)
    assert processor.counters.unknown_job == 0
    assert [d.kind for d in _decisions(bus)] == [DecisionKind.START_JOB, DecisionKind.COMPLETE_JOB]


def test_each_part_of_a_nodes_log_batch_counts_only_for_the_incarnations_that_node_runs():
    from trainwarden.bus.messages import LogPart, NodeLogBatch

    bus = _bus()
    producer = bus.producer()
    producer.send(EVENTS, "j1", encode(JobSubmitted(job_id="j1", time=T0, framework="pytorch", args="",
                                                    instances=instance_specs([("worker", 2)]))))
    for name, node in (("worker-0", "n"), ("worker-1", "m")):
        producer.send(EVENTS, "j1", encode(InstanceStarted(job_id="j1", time=T0, instance=name, round=0, start=0,
                                                           node=node)))
    processor = Processor(bus, load_rules())
    _drain(processor)
    parts = tuple(LogPart(instance=name, round=0, start=0, lines=(Line(T0 + 1, Stream.STDOUT, f"{name} on n"),
                                                                  Line(T0 + 2, Stream.STDOUT, "again")))
                  for name in ("worker-0", "worker-1"))
    producer.send(LOGS, "j1", encode(NodeLogBatch(job_id="j1", node="n", parts=parts)))
    _drain(processor)
    instances = processor.jobs["j1"].instances
    assert list(instances["worker-0"].tail) == ["worker-0 on n", "again"] and not instances["worker-1"].tail
    assert (processor.counters.log_lines, processor.counters.lines_from_other_nodes) == (2, 2)
