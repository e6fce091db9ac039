"""What a job run writes is what `trainwarden history` reads, on every backend."""

from __future__ import annotations

import pytest

from tests.store.store_factories import T0, fault, job, letter, replace, stages
from trainwarden.store.records import FAULT_FIELDS
from trainwarden.store.schema import table_of


def test_written_records_are_read_back_with_every_field_unchanged(backend):
    written = [fault(), job(), stages(), letter()]
    backend.writer.write(written)
    with backend.open_reader() as reader:
        faults, jobs, stage_rows, letters = (reader.faults(), reader.jobs(), reader.restart_stages(),
                                             reader.dead_letters())
    assert faults == [_as_dict(written[0])]
    assert set(FAULT_FIELDS) <= set(faults[0])
    assert jobs == [_as_dict(written[1])]
    assert stage_rows == [_as_dict(written[2])]
    assert letters == [_as_dict(written[3])]
    assert type(faults[0]["time"]) is float and type(faults[0]["round"]) is int


@pytest.mark.parametrize("moment", [0.0, 0.001, 1.5, T0, 2_147_483_648.5, 4_102_444_800.999])
def test_times_come_back_as_the_same_float_seconds(backend, moment):
    backend.writer.write([fault(time=moment, updated_at=moment)])
    with backend.open_reader() as reader:
        row = reader.faults()[0]
    assert (row["time"], row["updated_at"]) == (moment, moment)


def test_times_are_kept_to_the_millisecond(backend):
    backend.writer.write([fault(time=T0 + 0.0006)])
    with backend.open_reader() as reader:
        assert reader.faults()[0]["time"] == round(T0 + 0.0006, 3)


def test_a_pending_record_updated_later_shows_once_with_its_newer_result(backend):
    pending = fault()
    backend.writer.write([pending])
    with backend.open_reader() as reader:
        assert [r["result"] for r in reader.faults()] == ["pending"]
    backend.writer.write([replace(pending, result="done", duration_s=42.25, updated_at=T0 + 42.25)])
    with backend.open_reader() as reader:
        rows = reader.faults()
    assert [(r["record_id"], r["result"], r["duration_s"]) for r in rows] == [("r1", "done", 42.25)]


def test_an_older_version_written_after_a_newer_one_does_not_win(backend):
    done = fault(result="done", updated_at=T0 + 10)
    backend.writer.write([done])
    backend.writer.write([replace(done, result="pending", updated_at=T0)])
    with backend.open_reader() as reader:
        assert [r["result"] for r in reader.faults()] == ["done"]


def test_jobs_and_stages_keep_their_newest_version(backend):
    backend.writer.write([job(), stages()])
    backend.writer.write([job(status="succeeded", finished_at=T0 + 60, rounds=2, updated_at=T0 + 60),
                          stages(running_at=T0 + 3, updated_at=T0 + 3)])
    with backend.open_reader() as reader:
        assert [(j["status"], j["rounds"], j["finished_at"]) for j in reader.jobs()] == [("succeeded", 2, T0 + 60)]
        assert [s["running_at"] for s in reader.restart_stages()] == [T0 + 3]


def test_restart_stages_of_several_instances_of_one_decision_are_kept_apart(backend):
    backend.writer.write([stages(instance_name="worker-0"), stages(instance_name="worker-1")])
    with backend.open_reader() as reader:
        assert [s["instance_name"] for s in reader.restart_stages()] == ["worker-0", "worker-1"]


def test_faults_are_ordered_by_time_then_record_id_and_a_limit_keeps_the_newest(backend):
    backend.writer.write([fault("b", time=T0 + 1), fault("c", time=T0), fault("a", time=T0 + 1),
                          fault("d", time=T0 + 2)])
    with backend.open_reader() as reader:
        assert [r["record_id"] for r in reader.faults()] == ["c", "a", "b", "d"]
        assert [r["record_id"] for r in reader.faults(limit=2)] == ["b", "d"]
        assert reader.faults(limit=0) == []


@pytest.mark.parametrize("odd_id", ["job'; DROP TABLE fault_records; --", "back\\slash", "tab\there", "new\nline",
                                    "\\N", "NULL", "{job_id:String}", "ünïcødé 😀"])
def test_a_job_filter_matches_that_job_exactly_whatever_its_characters(backend, odd_id):
    backend.writer.write([fault("r1", job_id=odd_id), fault("r2", job_id="other"), job(job_id=odd_id),
                          stages(job_id=odd_id), job(job_id="other")])
    with backend.open_reader() as reader:
        assert [r["job_id"] for r in reader.faults(job_id=odd_id)] == [odd_id]
        assert [r["job_id"] for r in reader.jobs(job_id=odd_id)] == [odd_id]
        assert [r["job_id"] for r in reader.restart_stages(job_id=odd_id)] == [odd_id]
        assert sum(r["count"] for r in reader.aggregate(job_id=odd_id)) == 1
        assert len(reader.faults()) == 2


def test_jobs_with_a_limit_are_the_most_recently_submitted(backend):
    backend.writer.write([job("old", T0), job("new", T0 + 100), job("mid", T0 + 50)])
    with backend.open_reader() as reader:
        assert [j["job_id"] for j in reader.jobs()] == ["old", "mid", "new"]
        assert [j["job_id"] for j in reader.jobs(limit=1)] == ["new"]


def test_dead_letters_keep_the_newest_up_to_the_limit(backend):
    backend.writer.write([letter(f"e{i}", time=T0 + i) for i in range(5)])
    with backend.open_reader() as reader:
        assert [d["error"] for d in reader.dead_letters(limit=2)] == ["e3", "e4"]
        assert len(reader.dead_letters()) == 5


def test_aggregate_groups_counts_and_keeps_first_and_last_time(backend):
    oom = dict(error_signature="oom <n>", error_code=1, node_name="node-a", instance_name="worker-0")
    backend.writer.write([
        fault("a1", time=T0 + 10, error_message="oom 1", **oom),
        fault("a2", time=T0, error_message="oom 2", **oom),
        fault("a3", time=T0 + 20, error_message="oom 3", **oom),
        fault("b1", time=T0 + 5, error_signature="nccl timeout", error_code=6, error_message="nccl"),
        fault("c1", time=T0 + 5, instance_name="worker-1", error_message="oom 4",
              **{k: v for k, v in oom.items() if k != "instance_name"}),
    ])
    # A record's second version is still one fault.
    backend.writer.write([fault("a3", time=T0 + 20, error_message="oom 3", result="done", updated_at=T0 + 30, **oom)])
    with backend.open_reader() as reader:
        groups = reader.aggregate()
    assert groups[0].pop("error_message") in ("oom 1", "oom 2", "oom 3")  # one example of the group's messages
    assert groups[0] == {
        "error_source": "Instance", "error_code": 1, "error_signature": "oom <n>",
        "node_name": "node-a", "instance_name": "worker-0", "count": 3, "jobs": 1, "last_job": "job-1",
        "first_time": T0, "last_time": T0 + 20}
    assert sorted((g["error_signature"], g["instance_name"], g["count"]) for g in groups[1:]) == [
        ("nccl timeout", "worker-0", 1), ("oom <n>", "worker-1", 1)]
    assert groups[1]["count"] == groups[2]["count"] == 1


def test_an_empty_store_reads_as_empty_lists(backend):
    with backend.open_reader() as reader:
        assert (reader.faults(), reader.aggregate(), reader.jobs(), reader.restart_stages(),
                reader.dead_letters()) == ([], [], [], [], [])


def _as_dict(record) -> dict:
    """The record as the store returns it: times to the millisecond."""
    times = table_of(record).times
    return {f: round(v, 3) if f in times else v for f, v in zip(type(record).__struct_fields__, _values(record))}


def _values(record) -> list:
    return [getattr(record, f) for f in type(record).__struct_fields__]
