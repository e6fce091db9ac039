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
        wait_for(self.consumer.ready, 30, "the decisions topic's end")  # "latest" is looked up lazily

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

    def settled(self, predicate, timeout_s: float, what: str, quiet_s: float = 2.0) -> list[dict]:
        """Every decision seen once one ``predicate`` holds for has come and
        none more for ``quiet_s`` (a second one it may have caused included)."""
        self.first(predicate, timeout_s, what)
        quiet_until = time.monotonic() + quiet_s
        while time.monotonic() < quiet_until:
            count = len(self.seen)
            self.poll()
            if len(self.seen) > count:
                quiet_until = time.monotonic() + quiet_s
        return [d for _, d in self.seen]

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


def submit_controlled(services: ServiceProcesses, job_id: str, work: Path, args: str):
    work.mkdir()
    return services.submit("--job-id", job_id, "--nproc", "2", "--args", args, "--", *controlled_job(work))


def _round_started(work: Path, round_: int) -> bool:
    return started(work, 0, round_) and started(work, 1, round_)


def processor_takeover(services: Services, job_id: str, work: Path) -> float:
    """Kill the processor holding a running job and crash a rank at once:
    the seconds from the kill to the survivor's restart decision."""
    proc = submit_controlled(services, job_id, work, "--enable-job-restart=True")
    decisions = Decisions(services, job_id)
    try:
        wait_for(lambda: _round_started(work, 0), 60, "round 0 of both ranks")
        services.kill(services.owner(job_id))
        killed = time.monotonic()
        (work / "crash-0").touch()  # rank 1 fails now: a decision only a live processor can take
        when, _ = decisions.first(lambda d: d["kind"] == "restart_job", 60, "restart_job after the crash")
        wait_for(lambda: _round_started(work, 1), 30, "round 1 of both ranks")
        return when - killed
    finally:
        decisions.close()
        _end(proc)


def hang_during_takeover(services: Services, job_id: str, work: Path, interval_s: int) -> float:
    """Silence every rank, and kill the job's processor 2 s into the silence
    (the hang falls due while the survivor takes the job over): the seconds
    of silence until the ``job_hang`` decision."""
    proc = submit_controlled(services, job_id, work, f"--enable-job-restart=True --enable-job-hang-detection=True "
                                                     f"--job-hang-interval={interval_s}")
    decisions = Decisions(services, job_id)
    try:
        wait_for(lambda: _round_started(work, 0), 60, "round 0 of both ranks")
        owner = services.owner(job_id)
        (work / "hush").touch()
        silent_from = time.monotonic()
        time.sleep(2.0)  # the scenario's timing, not a wait for a condition
        services.kill(owner)
        when, _ = decisions.first(lambda d: d["reason"] == "job_hang", 60, "job_hang")
        return when - silent_from
    finally:
        decisions.close()
        _end(proc)


def actuator_restart(services: ServiceProcesses, job_id: str, work: Path) -> float:
    """Kill the actuator, crash a rank (the processor decides a restart at
    once) and start a new actuator, as a service manager does: the seconds
    from the kill to every instance of the new round started."""
    proc = submit_controlled(services, job_id, work, "--enable-job-restart=True")
    try:
        wait_for(lambda: _round_started(work, 0), 60, "round 0 of both ranks")
        services.kill("actuator")
        killed = time.monotonic()
        (work / "crash-0").touch()
        services.start("actuator")
        return wait_until(lambda: _round_started(work, 1), 60, "round 1 of both ranks") - killed
    finally:
        _end(proc)


def agent_restart(services: ServiceProcesses, job_id: str, work: Path, node_timeout_s: float) -> tuple[float, list[dict]]:
    """Kill the agent of the node running rank 1 and start it again at once,
    as a service manager does; once the node timeout has passed, rank 1
    crashes (a retryable error): the seconds from the crash to every
    instance of round 1 started, and the job's decisions until then. Rank 1
    is still round 0's own process when it crashes (``AssertionError`` if
    not): its new agent took it back, output and exit included."""
    proc = submit_controlled(services, job_id, work, "--enable-job-restart=True")
    decisions = Decisions(services, job_id)
    try:
        node = _rank_1_node_once_running(services, job_id, work)
        pid = int((work / "pid-1-0").read_text())
        services.kill(f"agent-{node}")
        killed = time.monotonic()
        services.start_agent(node)
        # Past the node timeout: a node the actuator took for lost would have had its job restarted by then.
        time.sleep(max(0.0, killed + node_timeout_s + 2.0 - time.monotonic()))
        assert _alive(pid), f"rank 1 of round 0 (pid {pid}) did not outlive its agent\n{services.logs()}"
        assert not _round_started(work, 1), f"the job restarted without a crash\n{services.logs()}"
        (work / "crash-0").touch()
        crashed = time.monotonic()
        took = wait_until(lambda: _round_started(work, 1), 60, "round 1 of both ranks") - crashed
        return took, decisions.settled(lambda d: d["kind"] == "restart_job", 30, "restart_job after the crash")
    finally:
        decisions.close()
        _end(proc)


def agent_killed_as_its_rank_crashes(services: ServiceProcesses, job_id: str, work: Path) -> tuple[float, list[dict]]:
    """Kill the agent of the node running rank 1 as rank 1 crashes (a
    retryable error, while no agent runs there), and start the agent again
    half a second later: the seconds from the crash to every instance of
    round 1 started, and the job's decisions until then. The crash reaches
    the new run through the keeper (exit status and output kept); the
    restart's start for that node may come before the new run has joined."""
    proc = submit_controlled(services, job_id, work, "--enable-job-restart=True")
    decisions = Decisions(services, job_id)
    try:
        node = _rank_1_node_once_running(services, job_id, work)
        services.kill(f"agent-{node}")
        (work / "crash-0").touch()
        crashed = time.monotonic()
        time.sleep(0.5)  # the scenario's timing: the agent's service manager restarts it
        services.start_agent(node)
        took = wait_until(lambda: _round_started(work, 1), 60, "round 1 of both ranks") - crashed
        return took, decisions.settled(lambda d: d["kind"] == "restart_job", 30, "restart_job after the crash")
    finally:
        decisions.close()
        _end(proc)


def _rank_1_node_once_running(services: ServiceProcesses, job_id: str, work: Path) -> str:
    wait_for(lambda: _round_started(work, 0), 60, "round 0 of both ranks")
    wait_for(lambda: _node_of(services, job_id, "worker-1"), 30, "worker-1's output file")
    return _node_of(services, job_id, "worker-1")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def restartable_broker(bootstrap: str) -> None:
    """Skip, saying why, unless KAFKA_DATA_DIR names the local-kafka broker
    at ``bootstrap`` (as .ci/run sets it): a test stops and starts only a
    broker it was pointed at, never a shared one by its default directory."""
    from tests.cluster.processes import KAFKA_SCRIPT

    if not os.environ.get("KAFKA_DATA_DIR"):
        pytest.skip("this test stops and starts the broker: set KAFKA_DATA_DIR to the data directory of the "
                    "deploy/kafka/local-kafka broker at TRAINWARDEN_KAFKA (.ci/run does)")
    env = dict(os.environ, KAFKA_PORT=bootstrap.rsplit(":", 1)[1])
    status = subprocess.run([str(KAFKA_SCRIPT), "status"], env=env, capture_output=True, text=True, timeout=60)
    if status.returncode != 0:
        pytest.skip(f"no local-kafka broker of KAFKA_DATA_DIR={os.environ['KAFKA_DATA_DIR']} runs at {bootstrap}")


def broker_outage(services: ServiceProcesses, job_id: str, work: Path, outage_s: float) -> tuple[float, float]:
    """Stop the broker (deploy/kafka/local-kafka, TRAINWARDEN_KAFKA's port and
    KAFKA_DATA_DIR), crash a rank while it is down, start it again after
    ``outage_s``: the seconds from the broker ready again to every service's
    /readyz answering 200 (``services`` serve metrics), and to every instance
    of the round the crash calls for started."""
    from tests.cluster.processes import KAFKA_SCRIPT

    env = dict(os.environ, KAFKA_PORT=services.bootstrap.rsplit(":", 1)[1])
    proc = submit_controlled(services, job_id, work, "--enable-job-restart=True")
    try:
        wait_for(lambda: _round_started(work, 0), 60, "round 0 of both ranks")
        subprocess.run([str(KAFKA_SCRIPT), "stop"], env=env, check=True, capture_output=True, timeout=120)
        (work / "crash-0").touch()
        time.sleep(outage_s)  # the outage's length, the scenario's
        subprocess.run([str(KAFKA_SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=120)
        back = time.monotonic()
        ready = wait_until(lambda: all(_ready(services, name) for name in services.metrics_ports), 120,
                           "every service ready") - back
        acted = wait_until(lambda: _round_started(work, 1), 120, "round 1 of both ranks") - back
        return ready, acted
    finally:
        _end(proc)


def _ready(services: ServiceProcesses, name: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(services.metrics_url(name, "/readyz"), timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _node_of(services: ServiceProcesses, job_id: str, instance: str) -> str:
    """The node whose agent writes round 0 of ``instance``'s output ("" before it does)."""
    return next((n for n in services.node_names
                 if any((services.tmp / f"logs-{n}" / job_id / instance).glob("r0-*.log"))), "")


def _end(proc) -> None:
    proc.kill()
    proc.communicate(timeout=30)


__all__ = ["Decisions", "NCCL", "Services", "actuator_restart", "agent_killed_as_its_rank_crashes", "agent_restart",
           "broker_outage", "controlled_job",
           "hang_during_takeover", "processor_takeover", "restartable_broker", "short_session_broker", "started",
           "submit_controlled", "wait_for", "wait_until"]
