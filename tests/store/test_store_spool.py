"""Writers append to the spool; the next reader ingests it, exactly once, losing nothing."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from trainwarden.store import SpoolWriter, StoreError
from trainwarden.store.embedded import EmbeddedStore
from trainwarden.store.spool import pending_segments
from tests.store.store_factories import T0, fault, job, letter, replace, stages


def _segments(store_dir):
    return pending_segments(store_dir / "spool")


def test_each_write_is_one_complete_segment_and_leaves_no_temporary_file(store_dir):
    writer = SpoolWriter(store_dir)
    writer.write([fault("a"), job()])
    writer.write([stages()])
    names = sorted(os.listdir(store_dir / "spool"))
    assert len(names) == 2 and all(n.endswith(".jsonl") and not n.startswith(".") for n in names)
    assert [n.split("-")[1] for n in names] == [str(os.getpid())] * 2
    assert (store_dir / "spool" / names[0]).read_bytes().count(b"\n") == 2


def test_writing_nothing_makes_no_segment(store_dir):
    SpoolWriter(store_dir).write([])
    assert _segments(store_dir) == []


@pytest.mark.parametrize("bad, why", [
    (fault(round=-1), "round = -1"),
    (fault(error_code=2**31), "error_code"),
    (fault(round="1"), "Expected `int`"),
    (fault(time=float("nan")), "time"),
    (fault(time=1e12), "1900 to 2299"),
    (fault(duration_s=float("inf")), "duration_s"),
    (fault(error_message="lone \ud800 surrogate"), "surrogate"),
    (object(), "not object"),
])
def test_a_record_that_would_not_round_trip_is_refused_and_nothing_is_written(store_dir, bad, why):
    with pytest.raises(StoreError, match="Nothing was written") as caught:
        SpoolWriter(store_dir).write([fault("good"), bad])
    assert why in str(caught.value)
    assert caught.value.hint
    assert _segments(store_dir) == []


def test_opening_the_store_ingests_and_removes_the_segments(store_dir):
    SpoolWriter(store_dir).write([fault("a")])
    SpoolWriter(store_dir).write([fault("b")])
    with EmbeddedStore(store_dir) as store:
        assert (store.last_ingest.segments, store.last_ingest.rows) == (2, 2)
        assert [r["record_id"] for r in store.faults()] == ["a", "b"]
    assert _segments(store_dir) == []


def test_ingesting_the_same_segment_again_after_a_crash_does_not_duplicate(store_dir, tmp_path):
    SpoolWriter(store_dir).write([fault("a"), job(), stages(), letter()])
    (segment,) = _segments(store_dir)
    saved = tmp_path / "saved.jsonl"
    shutil.copy(segment, saved)
    with EmbeddedStore(store_dir):
        pass
    # The crash: the insert happened but the segment was not deleted.
    shutil.copy(saved, segment)
    with EmbeddedStore(store_dir) as store:
        assert store.last_ingest.rows == 4
        assert [len(store.faults()), len(store.jobs()), len(store.restart_stages()), len(store.dead_letters())] \
            == [1, 1, 1, 1]
        # The rows really are stored twice; FINAL is what makes them one.
        assert store.select("SELECT count() AS n FROM fault_records")[0]["n"] == 2


def test_an_update_in_the_same_segment_as_the_original_keeps_the_newer(store_dir):
    SpoolWriter(store_dir).write([fault(), replace(fault(), result="done", updated_at=T0 + 5)])
    with EmbeddedStore(store_dir) as store:
        assert [r["result"] for r in store.faults()] == ["done"]


@pytest.mark.parametrize("content, why", [
    (b"this is not json\n", "line 1"),
    (b'{"table": "fault_records", "row": {"record_id": "x"}}\n', "missing required field"),
    (b'{"table": "no_such_table", "row": {}}\n', "unknown table 'no_such_table'"),
    (b'{"table": "jobs", "row": ' + b'{"job_id": "j", "submitted_at": 1e12, "finished_at": 0, "status": "", '
     b'"reason": "", "framework": "", "args": "", "instances": 1, "rounds": 0, "node_name": "", '
     b'"updated_at": 0}}\n', "1900 to 2299"),
    (b"\xff\xfe binary \x00\n", "line 1"),
])
def test_a_bad_segment_moves_to_spool_bad_with_a_dead_letter_and_the_good_ones_still_ingest(store_dir, content, why):
    writer = SpoolWriter(store_dir)
    writer.write([fault("before", time=T0)])
    bad = store_dir / "spool" / f"{time.time_ns():020d}-999-000000001.jsonl"
    bad.write_bytes(content)
    writer.write([fault("after", time=T0 + 1)])
    with EmbeddedStore(store_dir) as store:
        assert [r["record_id"] for r in store.faults()] == ["before", "after"]
        (dead,) = store.dead_letters()
    assert (store_dir / "spool" / "bad" / bad.name).read_bytes() == content
    assert _segments(store_dir) == []
    assert dead["source"] == "store.spool"
    assert bad.name in dead["error"] and why in dead["error"] and f"spool/bad/{bad.name}" in dead["error"]
    assert dead["payload"] == content.decode("utf-8", errors="replace")
    with EmbeddedStore(store_dir) as store:
        assert len(store.dead_letters()) == 1


def test_a_bad_segment_is_ingested_whole_or_not_at_all(store_dir):
    (store_dir / "spool").mkdir(parents=True)
    good_line = (SpoolWriter(store_dir).write([fault("good")]), _segments(store_dir)[0].read_bytes())[1]
    for path in _segments(store_dir):
        path.unlink()
    (store_dir / "spool" / "1-1-1.jsonl").write_bytes(good_line + b"broken\n")
    with EmbeddedStore(store_dir) as store:
        assert store.faults() == []
        assert len(store.dead_letters()) == 1


def test_a_temporary_file_left_by_a_dead_writer_is_kept_in_spool_bad_with_a_dead_letter(store_dir):
    SpoolWriter(store_dir).write([fault("a")])
    stale = store_dir / "spool" / ".00000000000000000001-4242-000000001.tmp"
    stale.write_bytes(b'{"table": "fault_records", "row": {"record_')
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fresh = store_dir / "spool" / ".99999999999999999999-4243-000000001.tmp"
    fresh.write_bytes(b"being written")
    with EmbeddedStore(store_dir) as store:
        assert [r["record_id"] for r in store.faults()] == ["a"]
        (dead,) = store.dead_letters()
    assert "stopped while writing" in dead["error"]
    assert (store_dir / "spool" / "bad" / stale.name.lstrip(".")).exists()
    assert fresh.exists()


def test_one_writer_shared_by_threads_loses_no_record(store_dir):
    writer = SpoolWriter(store_dir)

    def work(thread: int) -> None:
        for i in range(40):
            writer.write([fault(f"t{thread}-{i}", time=T0 + i)])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(_segments(store_dir)) == 320
    with EmbeddedStore(store_dir) as store:
        assert len(store.faults()) == 320


def test_an_unwritable_spool_is_a_store_error_with_a_hint(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="could not take 1 records") as caught:
        SpoolWriter(blocker).write([fault()])
    assert "free space" in caught.value.hint


def test_an_insert_that_fails_leaves_every_segment_in_the_spool(store_dir):
    with EmbeddedStore(store_dir)._using() as sql:
        sql.execute("DROP TABLE fault_records")
    SpoolWriter(store_dir).write([fault("kept")])
    with pytest.raises(StoreError, match="failed an insert") as caught:
        EmbeddedStore(store_dir).faults()
    assert "nothing was lost" in caught.value.hint
    (segment,) = _segments(store_dir)
    aside = store_dir / "aside.jsonl"
    segment.rename(aside)
    with EmbeddedStore(store_dir)._using() as sql:  # repair: let migration 1 create the table again
        sql.execute("TRUNCATE TABLE schema_migrations")
    aside.rename(segment)
    assert [r["record_id"] for r in EmbeddedStore(store_dir).faults()] == ["kept"]
