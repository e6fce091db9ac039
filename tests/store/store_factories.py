"""Records for the store tests, with every field filled in."""

from __future__ import annotations

import msgspec

from trainwarden.store.records import DeadLetter, FaultRecord, JobRecord, RestartStages

T0 = 1_700_000_000.123


def fault(record_id: str = "r1", job_id: str = "job-1", time: float = T0, **changes) -> FaultRecord:
    values = dict(
        record_id=record_id, job_id=job_id, time=time, round=1, node_name="node-a", instance_name="worker-0",
        error_code=1, error_message="RuntimeError: CUDA error: out of memory (tried 2.00 GiB)",
        error_source="Instance", action="restart_job", result="pending", duration_s=0.0, reason="retryable",
        rule="default.restart", classifier="cuda_oom", category="oom",
        error_signature="RuntimeError: CUDA error: out of memory (tried <n> GiB)", updated_at=time)
    values.update(changes)
    return FaultRecord(**values)


def job(job_id: str = "job-1", submitted_at: float = T0, **changes) -> JobRecord:
    values = dict(job_id=job_id, submitted_at=submitted_at, finished_at=0.0, status="running", reason="",
                  framework="pytorch", args="--max-restarts=3", instances=4, rounds=0, node_name="node-a",
                  updated_at=submitted_at)
    values.update(changes)
    return JobRecord(**values)


def stages(record_id: str = "r1", job_id: str = "job-1", **changes) -> RestartStages:
    values = dict(record_id=record_id, job_id=job_id, round=1, instance_name="", detected_at=T0,
                  decided_at=T0 + 0.004, stopped_at=T0 + 1.5, restarted_at=T0 + 2.25, running_at=0.0,
                  updated_at=T0 + 2.25)
    values.update(changes)
    return RestartStages(**values)


def letter(error: str = "unknown event kind 'x'", time: float = T0, **changes) -> DeadLetter:
    values = dict(time=time, source="sdk", job_id="job-1", error=error, payload='{"kind": "x"}')
    values.update(changes)
    return DeadLetter(**values)


def replace(record: msgspec.Struct, **changes) -> msgspec.Struct:
    return msgspec.structs.replace(record, **changes)
