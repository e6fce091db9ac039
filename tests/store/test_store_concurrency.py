"""Processes and threads sharing one store: a long run writes while `history` reads."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trainwarden.store import SpoolWriter, StoreError
from trainwarden.store.embedded import EmbeddedStore
from tests.store.store_factories import fault

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent("""
    import sys, time
    from trainwarden.store import open_writer
    from trainwarden.store.records import FaultRecord
    writer = open_writer(sys.argv[1])
    end = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < end:
        writer.write([FaultRecord(record_id=f"w{n}", job_id="job-w", time=1.7e9 + n, round=0, node_name="n",
            instance_name="i", error_code=1, error_message="m", error_source="Instance", action="restart_job",
            result="pending", duration_s=0.0, reason="", rule="", classifier="", category="",
            error_signature="m", updated_at=1.7e9 + n)])
        n += 1
        time.sleep(0.002)
    print(n, "chdb" in sys.modules, "clickhouse_connect" in sys.modules)
""")

READER = textwrap.dedent("""
    import sys
    from trainwarden.store import open_reader
    counts = []
    for _ in range(int(sys.argv[2])):
        counts.append(len(open_reader(sys.argv[1]).faults()))
    print(*counts)
""")


def _spawn(script: str, *args: object) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO / "pipeline") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out


def test_a_reader_in_another_process_reads_while_a_writer_process_keeps_writing(store_dir):
    # Long enough for several reads even on a loaded 2-core machine, where
    # opening chDB can take the better part of a second.
    writer = _spawn(WRITER, store_dir, 4.0)
    seen = []
    while writer.poll() is None:
        with EmbeddedStore(store_dir) as store:
            seen.append(len(store.faults(job_id="job-w")))
        time.sleep(0.05)
    written, writer_loaded_chdb, writer_loaded_connect = _finish(writer).split()
    with EmbeddedStore(store_dir) as store:
        final = len(store.faults(job_id="job-w"))
    assert len(seen) >= 3, seen
    assert seen == sorted(seen) and seen[-1] > 0, seen  # reads saw the history grow, never shrink
    assert final == int(written) > 100
    # Writing never touches chDB, so a job run does not even load it.
    assert (writer_loaded_chdb, writer_loaded_connect) == ("False", "False")


def test_two_reader_processes_at_once_both_succeed_while_a_writer_writes(store_dir):
    SpoolWriter(store_dir).write([fault(f"r{i}") for i in range(50)])
    writer = _spawn(WRITER, store_dir, 2.0)
    readers = [_spawn(READER, store_dir, 8) for _ in range(2)]
    outputs = [_finish(reader) for reader in readers]
    written = int(_finish(writer).split()[0])
    for output in outputs:
        counts = [int(c) for c in output.split()]
        assert len(counts) == 8 and counts == sorted(counts) and counts[0] >= 50
    with EmbeddedStore(store_dir) as store:
        assert len(store.faults()) == 50 + written


def test_a_writer_never_waits_for_the_store_lock(store_dir):
    with EmbeddedStore(store_dir) as store:
        started = time.monotonic()
        SpoolWriter(store_dir).write([fault()])
        assert time.monotonic() - started < 0.5
        assert store.faults() == []  # spooled, waiting for the next open
    assert len(EmbeddedStore(store_dir).faults()) == 1


def test_a_store_locked_too_long_is_a_clear_error_naming_the_holder(store_dir):
    EmbeddedStore(store_dir).faults()
    with open(store_dir / "store.lock", "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("12345\n")
        held.flush()
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            EmbeddedStore(store_dir, lock_timeout_s=0.3).faults()
        assert 0.3 <= time.monotonic() - started < 2
    assert str(caught.value) == (f"The history store {store_dir.resolve()} is busy (locked by another trainwarden "
                                 "process for more than 0.3 s).")
    assert "process 12345 holds" in caught.value.hint
    assert len(EmbeddedStore(store_dir).faults()) == 0  # released: usable again


def test_the_lock_is_held_only_during_a_call_or_a_with_block(store_dir):
    store = EmbeddedStore(store_dir)
    store.faults()
    assert _can_lock(store_dir)
    with store:
        assert not _can_lock(store_dir)
        with store:  # re-entering the same store is fine
            store.jobs()
        assert not _can_lock(store_dir)
    assert _can_lock(store_dir)


def test_threads_sharing_one_store_take_turns(store_dir):
    SpoolWriter(store_dir).write([fault()])
    store = EmbeddedStore(store_dir)
    results, errors = [], []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(len(store.faults()))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and results == [1] * 20


def test_one_process_can_use_several_stores_one_after_the_other(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    SpoolWriter(a).write([fault("in-a")])
    SpoolWriter(b).write([fault("in-b")])
    assert [r["record_id"] for r in EmbeddedStore(a).faults()] == ["in-a"]
    assert [r["record_id"] for r in EmbeddedStore(b).faults()] == ["in-b"]
    assert [r["record_id"] for r in EmbeddedStore(a).faults()] == ["in-a"]


def test_opening_a_second_store_inside_the_first_ones_block_is_a_clear_error(tmp_path):
    with EmbeddedStore(tmp_path / "a"):
        with pytest.raises(StoreError, match="one store per process at a time"):
            EmbeddedStore(tmp_path / "b").faults()
        with pytest.raises(StoreError, match="one store per process at a time"):
            EmbeddedStore(tmp_path / "a").faults()
    assert EmbeddedStore(tmp_path / "b").faults() == []


def _can_lock(store_dir: Path) -> bool:
    with open(store_dir / "store.lock", "r+") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(probe, fcntl.LOCK_UN)
        return True


def test_a_chdb_directory_held_by_a_program_that_ignores_the_lock_is_a_clear_error(store_dir):
    EmbeddedStore(store_dir).faults()
    holder = _spawn("import sys, time\nfrom chdb import session\ns = session.Session(sys.argv[1])\n"
                    "print('ready', flush=True)\ntime.sleep(30)", store_dir / "chdb")
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="could not be opened") as caught:
            EmbeddedStore(store_dir).faults()
        assert "other than trainwarden" in caught.value.hint
        assert _can_lock(store_dir)  # the store lock was given back
    finally:
        holder.kill()
        holder.wait()
    assert EmbeddedStore(store_dir).faults() == []
