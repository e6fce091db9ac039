"""The processor on the in-process bus and a pinned clock, fed by an agent
whose clock is off by an hour or by 4 s: silence is judged by when lines and
reports arrive at the processor, live and after a takeover's replay."""

import msgspec
import pytest

from trainwarden.bus import EVENTS, LOGS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import Line, LogBatch
from trainwarden.bus.serde import encode
from trainwarden.events import InstanceStarted, JobSubmitted, Reason, Stream
from trainwarden.rules.loader import load_rules
from trainwarden.services.loop import TICK_S, ServiceLoop
from trainwarden.services.processor import GROUP, Processor
from trainwarden.simulation.cluster import instance_specs

T0 = 1_800_000_000.0
HANG = "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=5"
NAMES = ("worker-0", "worker-1")
SKEWS = [-3600.0, -4.0, 4.0, 3600.0]


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> float:
        return self.now


class SkewedAgent:
    """What a node agent whose clock reads ``skew_s`` off sends about job j1."""

    def __init__(self, bus: MemoryBus, clock: Clock, skew_s: float):
        self.producer = bus.producer()
        self.clock = clock
        self.skew_s = skew_s
        self.last_line = {name: self.time for name in NAMES}

    @property
    def time(self) -> float:
        return self.clock.now + self.skew_s

    def submit_and_start(self) -> None:
        self.producer.send(EVENTS, "j1", encode(JobSubmitted(
            job_id="j1", time=self.time, framework="pytorch", args=HANG, instances=instance_specs([("worker", 2)]),
            activity_reports=True)))
        for name in NAMES:
            self.producer.send(EVENTS, "j1", encode(InstanceStarted(job_id="j1", time=self.time, instance=name,
                                                                    round=0, start=0, node="n1")))

    def print_lines(self) -> None:
        for name in NAMES:
            self.producer.send(LOGS, "j1", encode(LogBatch(job_id="j1", node="n1", instance=name, round=0, start=0,
                                                           lines=(Line(self.time, Stream.STDOUT, "step"),))))
            self.last_line[name] = self.time

    def report(self) -> None:
        # As the wire carries it (docs/MESSAGES.md): the silence as a duration,
        # and, for readers older than silent_s, the last output on the agent's clock.
        self.producer.send(EVENTS, "j1", b'{"v":1,' + msgspec.json.encode({
            "type": "instance_activity", "job_id": "j1", "time": self.time, "node": "n1",
            "instances": [{"instance": name, "round": 0, "start": 0, "last_output": self.last_line[name],
                           "silent_s": self.time - self.last_line[name], "spoke": True} for name in NAMES]})[1:])


def _submitted(skew_s):
    """A bus on which an agent ``skew_s`` off has submitted job j1 and started its two instances."""
    bus, clock, decided = MemoryBus(), Clock(), []
    bus.create_topics(topic_specs(2))
    agent = SkewedAgent(bus, clock, skew_s)
    agent.submit_and_start()
    return bus, clock, decided, agent


def _processor(bus, clock, decided) -> ServiceLoop:
    """The processor on the service loop, whose ticks follow the pinned clock."""
    return ServiceLoop(Processor(bus, load_rules(), clock=clock, on_decision=decided.append), clock)


def _drive(loop, agent, clock, until_s, print_every_s=None, decided=None) -> float | None:
    """Tick by tick until ``until_s`` (seconds after T0): the agent prints every
    ``print_every_s`` (None: never) and reports every second. When a hang was decided."""
    last_print = clock.now - T0
    while clock.now - T0 < until_s:
        clock.now = round(clock.now + TICK_S, 6)
        elapsed = clock.now - T0
        if print_every_s is not None and elapsed - last_print >= print_every_s - 1e-6:
            agent.print_lines()
            last_print = elapsed
        if abs(elapsed - round(elapsed)) < 1e-6:
            agent.report()
        loop.once()
        if any(d.reason is Reason.JOB_HANG for d in decided):
            return elapsed
    return None


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_hang_on_an_agent_whose_clock_is_off_is_decided_an_interval_after_the_last_line_arrived(skew_s):
    bus, clock, decided, agent = _submitted(skew_s)
    processor = _processor(bus, clock, decided)
    _drive(processor, agent, clock, 10, print_every_s=1.0, decided=decided)  # the last lines at 10 s
    fired = _drive(processor, agent, clock, 60, decided=decided)
    assert fired is not None and 10 + 5 <= fired <= 10 + 5 + TICK_S, (fired, decided)


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_healthy_job_on_an_agent_whose_clock_is_off_is_not_declared_hung(skew_s):
    bus, clock, decided, agent = _submitted(skew_s)
    processor = _processor(bus, clock, decided)
    assert _drive(processor, agent, clock, 60, print_every_s=2.0, decided=decided) is None
    assert processor.service.jobs["j1"].silence_checks_skipped == 0


def _silent_at_10_taken_over_at_13(skew_s, group: str):
    """The job's lines stop at 10 s, its processor dies at 12 s (the agent goes
    on reporting) and a processor of ``group`` takes the partitions over at
    13 s: when it decided the hang, and that processor."""
    bus, clock, decided, agent = _submitted(skew_s)
    first = _processor(bus, clock, decided)
    _drive(first, agent, clock, 10, print_every_s=1.0, decided=decided)  # the last lines at 10 s
    _drive(first, agent, clock, 12, decided=decided)
    first.service.close()
    for _ in range(5):
        clock.now = round(clock.now + TICK_S, 6)
        if abs(clock.now - T0 - round(clock.now - T0)) < 1e-6:
            agent.report()
    second = ServiceLoop(Processor(bus, load_rules(), group=group, clock=clock, on_decision=decided.append), clock)
    return _drive(second, agent, clock, 60, decided=decided), second.service, decided


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_processor_taking_over_neither_fires_a_hang_early_nor_holds_it_back_past_a_report(skew_s):
    fired, second, decided = _silent_at_10_taken_over_at_13(skew_s, GROUP)
    assert second.counters.replayed > 0
    # The silence since 10 s, as the agent reported it at 13 s: an interval after 10 s, late by
    # at most the time since that report when the replay ended.
    assert fired is not None and 15 <= fired <= 15 + 1 + TICK_S, (fired, decided)


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_healthy_job_is_not_declared_hung_by_a_processor_taking_over(skew_s):
    bus, clock, decided, agent = _submitted(skew_s)
    first = _processor(bus, clock, decided)
    _drive(first, agent, clock, 10, print_every_s=2.0, decided=decided)
    first.service.close()
    second = _processor(bus, clock, decided)
    assert _drive(second, agent, clock, 60, print_every_s=2.0, decided=decided) is None


@pytest.mark.parametrize("skew_s", SKEWS)
def test_lines_read_again_after_a_takeover_do_not_restart_a_silence_the_agent_reported(skew_s):
    # The worst case of a processor killed before it committed what it read:
    # its successor reads every line of the job again (a group with no
    # committed offsets). They are old output: the hang still falls due an
    # interval after the last line, not an interval after the takeover.
    fired, second, decided = _silent_at_10_taken_over_at_13(skew_s, "nothing-committed")
    assert second.counters.log_lines > 0
    assert fired is not None and 15 <= fired <= 15 + 1 + TICK_S, (fired, decided)


@pytest.mark.parametrize("skew_s", SKEWS)
def test_a_line_newer_than_the_agents_last_report_still_counts_as_output(skew_s):
    bus, clock, decided, agent = _submitted(skew_s)
    processor = _processor(bus, clock, decided)
    _drive(processor, agent, clock, 10.5, print_every_s=1.0, decided=decided)  # the last report at 10 s
    agent.print_lines()  # between two reports: fresh output, read at the next turn
    read = clock.now - T0 + TICK_S
    fired = _drive(processor, agent, clock, 60, decided=decided)
    assert fired is not None and read + 5 - 1e-6 <= fired <= read + 5 + 1e-6, (fired, decided)
