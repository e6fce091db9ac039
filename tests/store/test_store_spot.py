"""Spot lifecycle rows and per-job costs (migration 0005), on every backend."""

from __future__ import annotations

import msgspec
import pytest

from trainwarden.store.records import SpotTransition
from tests.store.store_factories import T0


def step(record_id: str, job_id: str, at: float, state: str, **changes) -> SpotTransition:
    values = dict(record_id=record_id, job_id=job_id, time=T0 + at, round=0, state=state, action="start_job",
                  reason="bid_accepted", message="bid accepted", paid=0.0, on_demand=0.0, held_s=0.0,
                  queued_s=0.0, preemptions=0, resumes=0, updated_at=T0 + at)
    values.update(changes)
    return SpotTransition(**values)


def test_lifecycle_steps_are_read_back_in_order_with_every_field(backend):
    written = [step("b", "j1", 2, "running", queued_s=2.0),
               step("a", "j1", 0, "queued", action="queue_job", reason="spot_queued")]
    backend.writer.write(written)
    with backend.open_reader() as reader:
        rows = reader.spot_transitions(job_id="j1")
    assert rows == [msgspec.structs.asdict(written[1]), msgspec.structs.asdict(written[0])]


def test_a_jobs_cost_is_that_of_its_newest_step_and_jobs_are_kept_apart(backend):
    backend.writer.write([
        step("q", "j1", 0, "queued", action="queue_job"),
        step("s", "j1", 2, "running", queued_s=2.0),
        step("p", "j1", 6, "requeued", action="requeue", reason="preempted", paid=0.0007, on_demand=0.0027,
             held_s=4.0, queued_s=2.0, preemptions=1, round=0),
        step("r", "j1", 8, "running", action="resume_job", paid=0.0007, on_demand=0.0027, held_s=4.0,
             queued_s=4.0, preemptions=1, resumes=1, round=1),
        step("c", "j1", 11, "succeeded", action="complete_job", paid=0.0012, on_demand=0.0047, held_s=7.0,
             queued_s=4.0, preemptions=1, resumes=1, round=1),
        step("q2", "j2", 20, "queued", action="queue_job"),
    ])
    with backend.open_reader() as reader:
        costs = reader.job_costs()
        only = reader.job_costs(job_id="j2")
    first, second = costs
    assert first["job_id"] == "j1" and first["state"] == "succeeded" and first["preemptions"] == 1
    assert first["paid"] == pytest.approx(0.0012) and first["on_demand"] == pytest.approx(0.0047)
    assert first["queued_s"] == 4.0 and first["held_s"] == 7.0 and first["resumes"] == 1
    assert first["first_time"] == pytest.approx(T0, abs=1e-3) and first["last_time"] == pytest.approx(T0 + 11, abs=1e-3)
    assert second["job_id"] == "j2" and second["state"] == "queued" and only == [second]


def test_a_rewritten_step_keeps_only_its_newest_version(backend):
    backend.writer.write([step("s", "j1", 2, "running"), step("s", "j1", 2, "running", message="again",
                                                                updated_at=T0 + 5)])
    with backend.open_reader() as reader:
        [row] = reader.spot_transitions()
    assert row["message"] == "again"
