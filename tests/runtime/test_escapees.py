"""Escaped descendants found over /proc by their mark: each process's
environment is read once, when first listed (one showing none again for a
moment), and a process is killed only when read again just before, still marked."""

from __future__ import annotations

import os
import subprocess
import sys

from trainwarden.runtime.escapees import MarkedProcesses
from trainwarden.runtime.keeper import MARK_VARIABLE
from trainwarden.runtime.stopping import alive
from tests.waiting import wait_for_value


def _sleeper(mark: str) -> subprocess.Popen:
    """A process carrying a mark that left its parent's session, as a daemon
    does; returned once exec'd (before, it shows this unmarked test's environment)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               env={**os.environ, MARK_VARIABLE: mark}, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_value(lambda: f"{MARK_VARIABLE}={mark}".encode() in open(f"/proc/{process.pid}/environ", "rb").read(),
                   10, "its exec")
    return process


def _listed(proc, process: subprocess.Popen) -> None:
    """A fake /proc's entry for a real process (its environ read through it)."""
    os.symlink(f"/proc/{process.pid}", proc / str(process.pid))


def test_a_second_pass_reads_only_the_processes_started_since_the_first(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    marked = MarkedProcesses(str(proc))
    processes = [_sleeper(f"job-a-{n}") for n in range(3)]
    try:
        for process in processes:
            _listed(proc, process)
        assert marked.kill(["nobody"]) == 0 and marked.reads == 3
        processes.append(_sleeper("job-a-3"))
        _listed(proc, processes[-1])
        assert marked.kill(["job-a-3"]) == 1 and marked.reads == 4
        processes[-1].wait(5)
        assert all(alive(p.pid) for p in processes[:3])
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_remembered_process_is_killed_only_if_it_still_carries_the_mark_when_read_again(tmp_path, monkeypatch):
    from trainwarden.runtime import escapees

    marked = MarkedProcesses()
    process = _sleeper("job-b-1")
    try:
        assert marked.kill(["nobody"]) == 0  # remembered as marked job-b-1
        real = escapees._marks_of
        monkeypatch.setattr(escapees, "_marks_of", lambda pid: frozenset() if pid == process.pid else real(pid))
        assert marked.kill(["job-b-1"]) == 0  # re-read: no longer marked (a new process in its pid)
        assert alive(process.pid)
        monkeypatch.setattr(escapees, "_marks_of", real)
        assert marked.kill(["job-b-1"]) == 1
        wait_for_value(lambda: process.poll() is not None, 5, "its end")
    finally:
        process.kill()
        process.wait()


def test_a_pid_used_again_by_a_new_process_is_read_again(tmp_path):
    """By the inode of /proc/PID: a fake /proc whose entry is replaced."""
    proc = tmp_path / "proc"
    proc.mkdir()
    target = _sleeper("job-c-1")
    try:
        os.symlink(f"/proc/{target.pid}", proc / str(target.pid))
        marked = MarkedProcesses(str(proc))
        assert marked.kill(["nobody"]) == 0 and marked.reads == 1
        assert marked.kill(["nobody"]) == 0 and marked.reads == 1  # the same entry: not read again
        os.symlink(f"/proc/{target.pid}", proc / "new")  # made while the old one exists: a new inode
        os.replace(proc / "new", proc / str(target.pid))
        assert marked.kill(["job-c-1"]) == 1 and marked.reads == 2
        wait_for_value(lambda: target.poll() is not None, 5, "its end")
    finally:
        target.kill()
        target.wait()
