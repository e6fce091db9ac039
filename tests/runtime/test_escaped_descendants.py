"""A process an instance started that left its process group (setsid, as
daemons do) ends with the instance: when the instance exits by itself, and
when it is stopped, killed before the stop returns (the next incarnation
starts only then)."""

from __future__ import annotations

import os
import sys
import time

from trainwarden.events import InstanceExited
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.stopping import alive
from tests.waiting import wait_for_value

# Starts a child that leaves the session and sleeps, writes the child's pid, then lives LIFE seconds.
PROGRAM = r'''
import os, subprocess, sys, time
pidfile, life = sys.argv[1], float(sys.argv[2])
subprocess.Popen([sys.executable, "-c",
                  "import os, sys, time; os.setsid(); open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
                  "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)", pidfile])
while not os.path.exists(pidfile):
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(life)
'''


def _start(tmp_path, life_s: float):
    events: list = []
    runtime = LocalRuntime("job", events.append, "n1")
    program = tmp_path / "escape.py"
    program.write_text(PROGRAM)
    pidfile = tmp_path / "escaped.pid"
    runtime.start("worker-0", [sys.executable, str(program), str(pidfile), str(life_s)], dict(os.environ), None, 0, 0)
    escaped = int(wait_for_value(lambda: pidfile.exists() and pidfile.read_text(), 20, "the escaped child"))
    return runtime, events, escaped


def test_a_child_that_left_the_group_of_an_instance_that_exited_by_itself_is_killed(tmp_path):
    runtime, events, escaped = _start(tmp_path, life_s=0.5)
    try:
        wait_for_value(lambda: any(isinstance(e, InstanceExited) for e in events), 20, "the instance's exit")
        wait_for_value(lambda: not alive(escaped), 5, "the escaped child's end")
        assert runtime.counters.escaped_processes_killed == 1
    finally:
        runtime.close(0.5)


def test_a_child_that_left_the_group_of_a_stopped_instance_is_gone_when_the_stop_returns(tmp_path):
    runtime, events, escaped = _start(tmp_path, life_s=600)
    try:
        runtime.stop(["worker-0"], grace_s=2.0)
        # Its SIGKILL is sent by then (the kernel ends it a moment later).
        assert runtime.counters.escaped_processes_killed == 1
        assert any(isinstance(e, InstanceExited) for e in events)
        wait_for_value(lambda: not alive(escaped), 2, "the escaped child's end")
    finally:
        runtime.close(0.5)


def test_escaped_children_of_instances_ending_one_after_another_are_swept_together_and_all_killed(
        tmp_path, monkeypatch):
    """A pass over /proc at most every SWEEP_SPACING_S, not one per reaping
    turn: the exits that come meanwhile wait for the next pass together, and
    every escaped child ends. (How many exits the first pass finds depends on
    how the machine's load bunches them; the spacing does not.)"""
    from trainwarden.runtime import local

    monkeypatch.setattr(local, "SWEEP_SPACING_S", 3.0)  # far longer than the exits' spread
    events: list = []
    runtime = LocalRuntime("job", events.append, "n1")
    passes = []
    real = local.kill_incarnations

    def counting(marks):
        marks = list(marks)
        passes.append((time.monotonic(), len(marks)))
        return real(marks)

    local.kill_incarnations = counting
    program = tmp_path / "escape.py"
    program.write_text(PROGRAM)
    try:
        for rank in range(6):  # they end 0.05 s apart, over several reaping turns
            pidfile = tmp_path / f"escaped-{rank}.pid"
            runtime.start(f"worker-{rank}", [sys.executable, str(program), str(pidfile), str(2.0 + 0.05 * rank)],
                          dict(os.environ), None, 0, 0)
        escaped = [int(wait_for_value(lambda r=rank: (tmp_path / f"escaped-{r}.pid").exists()
                                      and (tmp_path / f"escaped-{r}.pid").read_text(), 20, "an escaped child"))
                   for rank in range(6)]
        wait_for_value(lambda: sum(isinstance(e, InstanceExited) for e in events) == 6, 30, "every exit")
        wait_for_value(lambda: not any(alive(pid) for pid in escaped), 10, "every escaped child's end")
        assert runtime.counters.escaped_processes_killed == 6
        assert sum(count for _, count in passes) == 6, passes
        assert len(passes) < 6, passes  # some exits were swept together
        gaps = [later - earlier for (earlier, _), (later, _) in zip(passes, passes[1:])]
        assert all(gap >= 3.0 for gap in gaps), gaps
    finally:
        local.kill_incarnations = real
        runtime.close(0.5)


def test_a_start_sweeps_the_escaped_children_still_waiting_for_their_sweep_first(tmp_path, monkeypatch):
    from trainwarden.runtime import local

    monkeypatch.setattr(local, "SWEEP_SPACING_S", 60.0)
    events: list = []
    runtime = LocalRuntime("job", events.append, "n1")
    program = tmp_path / "escape.py"
    program.write_text(PROGRAM)
    try:
        for rank, life in ((0, 0.5), (1, 1.5)):
            runtime.start(f"worker-{rank}", [sys.executable, str(program), str(tmp_path / f"e{rank}.pid"), str(life)],
                          dict(os.environ), None, 0, 0)
        first, second = (int(wait_for_value(lambda r=rank: (tmp_path / f"e{r}.pid").exists()
                                            and (tmp_path / f"e{r}.pid").read_text(), 20, "an escaped child"))
                         for rank in (0, 1))
        wait_for_value(lambda: sum(isinstance(e, InstanceExited) for e in events) == 2, 30, "both exits")
        wait_for_value(lambda: not alive(first), 5, "the first escaped child's end (swept at once)")
        assert alive(second)  # its sweep waits for the spacing
        runtime.start("worker-1", [sys.executable, "-c", "pass"], dict(os.environ), None, 1, 1)
        wait_for_value(lambda: not alive(second), 2, "the second escaped child's end")
        assert runtime.counters.escaped_processes_killed == 2
    finally:
        runtime.close(0.5)
