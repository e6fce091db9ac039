"""A disk that fills during a run: the history records the run could not write
are kept, the run waits for space when it ends (saying so), and then either
every record is in the history or the run fails naming how many were lost.

A real full disk: a small tmpfs as the store (we run as root), filled with a
filler file once the job runs. The job fails once, after the disk is full, and
succeeds when restarted, so the restart's records and the job's final record
all meet the full disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRAINWARDEN

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
# Round 0 waits for the test to fill the disk, then fails as a retryable fault; round 1 succeeds.
JOB = f'''
import os, sys, time
print("round", os.environ["TRAINWARDEN_RESTART_ROUND"], flush=True)
if os.environ["TRAINWARDEN_RESTART_ROUND"] == "0":
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    print({NCCL!r}, file=sys.stderr, flush=True)
    sys.exit(1)
'''


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a real full disk needs a tmpfs mount, which is not permitted here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


class _DiskHog:
    """Another process's file that takes every byte of the disk, and every
    byte freed later (the run frees some when it ends), until it is removed."""

    def __init__(self, disk: Path):
        self.path = disk / "filler"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._stop = threading.Event()
        self._fill()
        self._thread = threading.Thread(target=self._keep_full, daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        chunk = 1 << 20
        while chunk:
            try:
                os.write(self._fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk //= 2

    def _keep_full(self) -> None:
        while not self._stop.wait(0.005):
            self._fill()

    def remove(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        os.close(self._fd)
        self.path.unlink()


def _wait_for(text: str, path: Path, run: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        if run.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} in the run's output (exit {run.poll()}):\n{path.read_text()[-4000:]}")
        time.sleep(0.05)


def _start(tmp_path: Path, disk: Path, job_id: str, wait_s: int) -> tuple[subprocess.Popen, Path, Path]:
    program, go, output = tmp_path / "job.py", tmp_path / "go", tmp_path / "run.log"
    program.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"), TRAINWARDEN_HISTORY_WAIT=str(wait_s))
    with open(output, "wb") as log:
        run = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--store", str(disk), "--stop-grace", "1",
                                "--args", "--enable-job-restart=True", "--", sys.executable, str(program), str(go)],
                               env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    _wait_for("round 0", output, run)  # the job is running: its first record is written
    return run, go, output


def _history(disk: Path, *args: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"))
    out = subprocess.run([*TRAINWARDEN, "history", "--store", str(disk), "--json", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_records_kept_while_the_disk_is_full_are_all_written_once_space_returns(tmp_path, small_disk, job_id):
    run, go, output = _start(tmp_path, small_disk, job_id, wait_s=120)
    hog = _DiskHog(small_disk)
    try:
        go.touch()
        _wait_for("waiting up to 120 s for space", output, run)
        hog.remove()
        assert run.wait(120) == 0, output.read_text()[-4000:]
        text = output.read_text()
        assert "No space left on device" in text
        assert "lost" not in text, text[-4000:]
        restarts = [(r["action"], r["result"]) for r in _history(small_disk, "--job", job_id)]
        assert restarts == [("restart_job", "done")], restarts
        jobs = [(j["job_id"], j["status"], j["rounds"]) for j in _history(small_disk, "--jobs")]
        assert jobs == [(job_id, "succeeded", 1)], jobs
    finally:
        hog.remove()
        if run.poll() is None:
            run.kill()
            run.wait()


def test_a_disk_that_stays_full_makes_the_run_fail_naming_how_many_records_were_lost(tmp_path, small_disk,
                                                                                        job_id):
    run, go, output = _start(tmp_path, small_disk, job_id, wait_s=2)
    hog = _DiskHog(small_disk)
    try:
        go.touch()
        code = run.wait(120)
        hog.remove()
        text = output.read_text()
        assert code == 1, text[-4000:]
        assert "waiting up to 2 s for space" in text, text[-4000:]
        lost = [line for line in text.splitlines() if "history records of this run were lost" in line]
        assert lost and lost[0].split("▸ ")[-1].split()[0].isdigit(), text[-4000:]
        assert int(lost[0].split("▸ ")[-1].split()[0]) >= 3, lost  # the fault's two rows and the job's end at least
        assert "No space left on device" in lost[0], lost
    finally:
        hog.remove()
        if run.poll() is None:
            run.kill()
            run.wait()


class _Said:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)


def test_the_backlog_is_bounded_and_what_it_drops_is_counted_and_said(tmp_path):
    from trainwarden.services.embedded import RetryingHistory
    from trainwarden.store.records import DeadLetter
    from trainwarden.store.spool import SpoolWriter, pending_segments

    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's spool directory must go")
    said = _Said()
    history = RetryingHistory(SpoolWriter(blocker), said)
    history.MAX_BACKLOG, history.CHUNK = 5, 2
    letters = [DeadLetter(time=float(i), source="sdk", job_id="j", error="r", payload=f"d{i}") for i in range(8)]
    history.write(letters[:4])
    history.write(letters[4:])
    assert (len(history.backlog), history.dropped) == (5, 3)
    assert [r.payload for r in history.backlog] == ["d3", "d4", "d5", "d6", "d7"]  # the newest are kept
    assert len(said.lines) == 2 and "oldest are dropped" in said.lines[1], said.lines
    blocker.unlink()
    assert history.retry()
    assert history.backlog == [] and len(pending_segments(blocker / "spool")) == 3  # in chunks of 2
    assert "work again" in said.lines[-1]
