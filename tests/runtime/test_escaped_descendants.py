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
