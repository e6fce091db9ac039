"""A realistic small history, written the way the services write it.

Fault records and restart stages come from the real ``Actuator`` executing
engine decisions on a fake runtime with a pinned clock; node events from the
actuator service's ``node_event``; jobs, diagnoses and stack reports are the
records the services build. Everything goes through the store's writer (the
spool for a directory), never through hand-written SQL.
"""

from __future__ import annotations

import dataclasses

from trainwarden.actuator import Actuator
from trainwarden.bus.messages import NodeState
from trainwarden.events import Decision, DecisionKind, ErrorSource, LogLine, Reason, Stream, action_id
from trainwarden.runtime.base import Capability
from trainwarden.services.actuator_service import node_event
from trainwarden.store.records import DiagnosisRecord, JobRecord, SpotTransition, StackReportRecord

T0 = 1_790_000_000.0  # 2026-09-21, a fixed moment
JOB_A = "seed-train-a"
JOB_B = "seed-train-b"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeRuntime:
    """Instances that start and stop instantly; every stop takes 1.5 s, every start 0.75 s."""

    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE})

    def __init__(self, clock: Clock, names: list[str]):
        self.clock = clock
        self.instance_names = names
        self.isolated: list[str] = []

    def start(self, name: str, round_: int, start: int) -> int:
        self.clock.advance(0.75 / len(self.instance_names))
        return 0

    def stop(self, names, snapshot: str = "", incarnations=None) -> None:
        self.clock.advance(1.5)

    def stop_all(self, snapshot: str = "") -> None:
        self.clock.advance(1.5)

    def isolate_node(self, node: str, reason: str) -> None:
        self.isolated.append(node)


@dataclasses.dataclass
class Seeded:
    jobs: tuple[str, ...]
    start: float
    end: float
    faults: int  # fault records (one per decision, newest version)


def _decision(job: str, kind: DecisionKind, reason: Reason, source: ErrorSource, round_: int, at: float,
              instance: str, node: str, code: int, message: str, signature: str) -> Decision:
    return Decision(kind=kind, reason=reason, rule="default", job_id=job, time=at, round=round_,
                    action_id=action_id(job, kind.value, round_, instance, at), error_source=source,
                    instance=instance, node=node, error_code=code, error_message=message,
                    error_signature=signature, category="seed", classifier="seed", detected_at=at,
                    starts=tuple((f"worker-{i}", round_ + 1) for i in range(4)))


def _job_record(job: str, submitted: float, finished: float, status: str, rounds: int, at: float) -> JobRecord:
    return JobRecord(job_id=job, submitted_at=submitted, finished_at=finished, status=status,
                     reason="" if status == "running" else "restart_limit_reached", framework="pytorch",
                     args="--max-restarts=5", instances=4, rounds=rounds, node_name="", updated_at=at)


def seed(writer) -> Seeded:
    """Write two jobs' histories; returns what was written."""
    clock = Clock(T0)
    names = [f"worker-{i}" for i in range(4)]
    faults = 0
    for job, failures in ((JOB_A, 3), (JOB_B, 2)):
        submitted = clock.now
        writer.write([_job_record(job, submitted, 0.0, "running", 0, submitted)])
        runtime = FakeRuntime(clock, names)
        actuator = Actuator(runtime, writer, "gpu-node-1", clock=clock)
        for round_ in range(failures):
            at = clock.advance(600)
            instance = names[round_ % 4]
            node = NODES[round_ % 3]
            hang = round_ == 1
            decision = _decision(
                job, DecisionKind.RESTART_JOB, Reason.RETRYABLE_FAILURE,
                ErrorSource.HANG if hang else ErrorSource.INSTANCE_EXIT, round_, at, instance, node,
                0 if hang else 1,
                "no output for 1800 s" if hang else f"RuntimeError: CUDA error: out of memory (tried {round_} GiB)",
                "hang" if hang else "RuntimeError: CUDA error: out of memory (tried <n> GiB)")
            clock.advance(2.0)  # deciding
            actuator.execute(decision)
            faults += 1
            clock.advance(30.0)  # the new incarnation prints its first line
            for name in names:
                actuator.observe(LogLine(job_id=job, instance=name, round=round_ + 1, start=round_ + 1,
                                         time=clock.now, stream=Stream.STDOUT, text="step 1"))
        if job == JOB_A:
            at = clock.advance(120)
            isolate = _decision(job, DecisionKind.ISOLATE_NODE, Reason.C4D_ERROR, ErrorSource.C4D, failures, at,
                                "worker-2", "gpu-node-2", 0, "RankCommHang on rank 2", "c4d:RankCommHang")
            actuator.execute(isolate)
            faults += 1
            writer.write([node_event(NodeState(node="gpu-node-2", state="isolated", time=at,
                                               reason=Reason.C4D_ERROR.value))])
            writer.write([DiagnosisRecord(
                diagnosis_id=f"{job}-c4d-1", job_id=job, time=at, node_name="gpu-node-2", source="c4d",
                kind="RankCommHang", level="Error", rank=2, detail="rank 2 stopped answering collectives",
                trusted=True, action="isolate_node+restart_job", updated_at=at)])
        hang_at = submitted + 1200
        writer.write([StackReportRecord(
            report_id=f"{job}-stacks-1", record_id=f"{job}-stacks-1", job_id=job, time=hang_at + 1, round=1,
            tool="py-spy", processes=4, groups=2, suspects="worker-1", verdict="worker-1 is not in the collective",
            missing="", report_json='{"groups": [], "missing": []}', updated_at=hang_at + 1)])
        writer.write([DiagnosisRecord(
            diagnosis_id=f"{job}-advice", job_id=job, time=hang_at, node_name="", source="advice",
            kind="hang_interval", level="Info", rank=-1, detail="NCCL watchdog 1800 s: set --hang-detect to 1860",
            trusted=False, action="recorded", updated_at=hang_at)])
        at = clock.advance(300)
        if job == JOB_B:
            fail = _decision(job, DecisionKind.FAIL_JOB, Reason.RESTART_LIMIT_REACHED, ErrorSource.INSTANCE_EXIT,
                             failures, at, "worker-0", "gpu-node-3", 2, "FileNotFoundError: data.bin",
                             "FileNotFoundError: <path>")
            actuator.execute(fail)
            faults += 1
            writer.write([_job_record(job, submitted, clock.now, "failed", failures, clock.now)])
        else:
            writer.write([_job_record(job, submitted, 0.0, "running", failures, clock.now)])
    # JOB_A ran on spot capacity: its lifecycle with the cost so far, as the actuator records it.
    for i, (state, action, paid, preemptions, resumes) in enumerate((
            ("queued", "queue_job", 0.0, 0, 0), ("running", "start_job", 0.0, 0, 0),
            ("requeued", "requeue", 1.5, 1, 0), ("running", "resume_job", 1.5, 1, 1))):
        at = T0 + 300 * i
        writer.write([SpotTransition(
            record_id=f"{JOB_A}-spot-{i}", job_id=JOB_A, time=at, round=resumes, state=state, action=action,
            reason="preempted" if action == "requeue" else "bid_accepted", message="", paid=paid,
            on_demand=paid * 3.0, held_s=600.0 * (i // 2), queued_s=120.0 + 60 * i, preemptions=preemptions,
            resumes=resumes, updated_at=at)])
    lost = clock.advance(60)
    writer.write([node_event(NodeState(node="gpu-node-3", state="lost", time=lost, reason="no heartbeat for 12 s")),
                  node_event(NodeState(node="gpu-node-3", state="ready", time=lost + 90, reason="heartbeat again"))])
    return Seeded(jobs=(JOB_A, JOB_B), start=T0, end=clock.now + 90, faults=faults)
