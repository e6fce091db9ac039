"""What the takeover tests share: a broker that grants short sessions, two
processors, a job whose instances crash or go silent when the test says so,
and the decisions as the test sees them, timed on the test's own clock."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.processes import ServiceProcesses, wait_for
from tests.conftest import ROOT

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
PARTITIONS = 4


def short_session_broker() -> str:
    """TRAINWARDEN_KAFKA, when its broker grants the consumers' 2 s sessions
    (deploy/kafka/local-kafka's does); else the test skips, saying why."""
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    from trainwarden.bus.kafka import KafkaBus, SESSION_TIMEOUT_MS

    from trainwarden.bus.base import TopicSpec

    bus = KafkaBus(bootstrap)
    bus.create_topics([TopicSpec("twt-session-probe", 1)])
    probe = bus.consumer(["twt-session-probe"], f"twt-session-probe-{os.getpid()}", from_beginning=False)
    try:
        deadline = time.monotonic() + 30
        while not probe.assignment() and time.monotonic() < deadline:
            probe.poll(0.2)
    finally:
        probe.close()
    if bus.session_ms != SESSION_TIMEOUT_MS:
        pytest.skip(f"the broker at {bootstrap} refuses {SESSION_TIMEOUT_MS} ms consumer sessions "
                    "(group.min.session.timeout.ms): start it with deploy/kafka/local-kafka, which allows them")
    return bootstrap


class Services(ServiceProcesses):
    """The services, with a second processor ("processor-b") and each
    processor's log of its own."""

    def start_second_processor(self) -> None:
        log = open(self.tmp / "processor-b.log", "ab")
        self.procs["processor-b"] = subprocess.Popen([*self.command, "processor"], env=self.env, cwd=ROOT,
                                                     stdout=log, stderr=subprocess.STDOUT)

    def events_partitions(self, processor: str) -> set[int]:
        """The events partitions a processor said it holds last (services/processor.py logs each assignment)."""
        path = self.tmp / f"{processor}.log"
        found = re.findall(r"events partitions ([\d,]+|none) assigned", path.read_text(errors="replace"))
        return set() if not found or found[-1] == "none" else {int(p) for p in found[-1].split(",")}

    def settled(self) -> bool:
        """Both processors hold two events partitions each, all four between them."""
        a, b = self.events_partitions("processor"), self.events_partitions("processor-b")
        return len(a) == len(b) == PARTITIONS // 2 and a | b == set(range(PARTITIONS))

    def owner(self, job_id: str) -> str:
        from kafka.partitioner.default import murmur2

        partition = (murmur2(job_id.encode()) & 0x7FFFFFFF) % PARTITIONS
        return "processor" if partition in self.events_partitions("processor") else "processor-b"


def controlled_job(directory: Path) -> list[str]:
    """A job's command: each incarnation writes its pid to ``pid-RANK-ROUND``
    and prints a line every 0.1 s; it goes silent while ``hush`` exists, and
    rank 1 crashes with a retryable error once ``crash-ROUND`` exists."""
    d = shlex.quote(str(directory))
    script = (f'echo $$ > {d}/pid-$RANK-$TRAINWARDEN_RESTART_ROUND; '
              f'while :; do '
              f'if [ "$RANK" = 1 ] && [ -e {d}/crash-$TRAINWARDEN_RESTART_ROUND ]; then '
              f'echo {shlex.quote(NCCL)} >&2; exit 1; fi; '
              f'[ -e {d}/hush ] || echo step; sleep 0.1; done')
    return ["sh", "-c", script]


def started(directory: Path, rank: int, round_: int) -> bool:
    return (directory / f"pid-{rank}-{round_}").exists()


class Decisions:
    """The job's decisions as they reach this test, each with when (this
    process's monotonic clock) it was read."""

    def __init__(self, services: ServiceProcesses, job_id: str):
        from trainwarden.bus.kafka import KafkaBus

        self.job_id = job_id
        self.consumer = KafkaBus(services.bootstrap).consumer([services.topic("decisions")], None)
        self.seen: list[tuple[float, dict]] = []

    def poll(self) -> None:
        for record in self.consumer.poll(0.05):
            try:
                message = json.loads(record.value)
            except ValueError:
                continue
            decision = message.get("decision") if message.get("type") == "decision" else None
            if decision and decision.get("job_id") == self.job_id:
                self.seen.append((time.monotonic(), decision))

    def first(self, predicate, timeout_s: float, what: str) -> tuple[float, dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            for when, decision in self.seen:
                if predicate(decision):
                    return when, decision
        raise AssertionError(f"no decision {what} within {timeout_s:.0f} s; seen {[d for _, d in self.seen]}")

    def close(self) -> None:
        self.consumer.close()


def wait_until(predicate, timeout_s: float, what: str) -> float:
    """Wait for ``predicate`` (polled every 20 ms); the monotonic time it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


__all__ = ["Decisions", "NCCL", "Services", "controlled_job", "short_session_broker", "started", "wait_for",
           "wait_until"]
