"""An agent's instances outlive it for a grace period (its keeper started
them and holds their pipes, runtime/keeper_lease.py): a new run of it takes
them back, output and exit status included, even of one that ended while no
agent ran; with no new run they end when the grace period does. The
"previous run" here is a real process, SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainwarden.events import InstanceExited, LogLine
from trainwarden.runtime import keeper_lease
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.stopping import alive
from tests.conftest import ROOT
from tests.other_user import other_python
from tests.waiting import wait_for_value

# A previous run of the agent: starts two instances through its keeper, says so, and waits to be killed.
PREVIOUS_RUN = r'''
import os, sys, time
from pathlib import Path
from trainwarden.runtime import keeper_lease
from trainwarden.runtime.local import LocalRuntime

socket_path, work, grace = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
listener = keeper_lease.listen_at(socket_path)
keeper_lease.enable_kept_instances(listener, grace)
listener.close()
runtime = LocalRuntime("job", lambda event: None, "n1")
waits = f"echo $$ > {work}/waits.pid; echo before; while [ ! -e {work}/go ]; do sleep 0.05; done; echo after; exit 7"
runtime.start("waits", ["sh", "-c", waits], dict(os.environ), None, 0, 0, keep={"job_id": "job", "token": "t1"})
runtime.start("quits", ["sh", "-c", f"while [ ! -e {work}/quit ]; do sleep 0.05; done; echo bye; exit 3"],
              dict(os.environ), None, 0, 0, keep={"job_id": "job", "token": "t2"})
(work / "started").touch()
time.sleep(600)
'''


@pytest.fixture(autouse=True)
def _no_socket_left(tmp_path):
    yield
    path = keeper_lease.socket_path_for(tmp_path / "logs")
    path.unlink(missing_ok=True)
    if path.parent.exists():
        path.parent.rmdir()


def _previous_run(tmp_path: Path, grace_s: float) -> tuple[Path, int]:
    """The previous run, killed once its instances run: the keeper's socket, and the waiting instance's pid."""
    socket_path = keeper_lease.socket_path_for(tmp_path / "logs")
    run = subprocess.Popen([sys.executable, "-c", PREVIOUS_RUN, str(socket_path), str(tmp_path), str(grace_s)],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "pipeline")})
    try:
        wait_for_value(lambda: (tmp_path / "started").exists() and (tmp_path / "waits.pid").exists(), 30, "the previous run")
        pid = int(wait_for_value(lambda: (tmp_path / "waits.pid").read_text().strip(), 10, "the instance's pid"))
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(10)
    return socket_path, pid


def test_a_new_run_takes_back_what_the_killed_one_started_with_its_output_and_exit_codes(tmp_path):
    socket_path, pid = _previous_run(tmp_path, grace_s=30.0)
    (tmp_path / "quit").touch()  # one ends while no agent runs: the keeper keeps its status and output
    time.sleep(0.3)  # the scenario's timing: it ends before the new run comes
    kept = keeper_lease.reclaim(socket_path)
    assert sorted(k.keep["instance"] for k in kept) == ["quits", "waits"]
    assert {k.keep["instance"]: k.status for k in kept} == {"quits": 3, "waits": None}
    assert all(k.keep["job_id"] == "job" for k in kept)
    events: list = []
    runtime = LocalRuntime("job", events.append, "n1", mark=kept[0].mark)
    try:
        for item in kept:
            runtime.readopt(item)
        # "quits" ended before: the runtime's reader may have reaped it already (its exit is checked below).
        assert "waits" in runtime.running()
        assert runtime.pid("waits") == pid and alive(pid)
        (tmp_path / "go").touch()
        wait_for_value(lambda: len([e for e in events if isinstance(e, InstanceExited)]) == 2, 20, "both exits")
        codes = {e.instance: e.exit_code for e in events if isinstance(e, InstanceExited)}
        lines = [(e.instance, e.text) for e in events if isinstance(e, LogLine)]
        assert codes == {"quits": 3, "waits": 7}
        # "before" was printed to the previous run (which read it or not): "after" only to this one.
        assert ("waits", "after") in lines and ("quits", "bye") in lines, lines
    finally:
        keeper = runtime._keeper.pid
        runtime.close(0.5)
    wait_for_value(lambda: not alive(keeper), 10, "the keeper's end with the last runtime")


def test_the_keeper_kills_what_no_new_run_took_back_within_the_grace_period(tmp_path):
    _socket_path, pid = _previous_run(tmp_path, grace_s=1.0)
    assert alive(pid)
    wait_for_value(lambda: not alive(pid), 10, "the kept instance's end after the grace period")


def test_a_new_incarnation_started_after_taking_back_gets_a_mark_of_its_own(tmp_path):
    socket_path, _pid = _previous_run(tmp_path, grace_s=30.0)
    kept = keeper_lease.reclaim(socket_path)
    runtime = LocalRuntime("job", lambda event: None, "n1", mark=kept[0].mark)
    try:
        for item in kept:
            runtime.readopt(item)
        runtime.start("third", ["sleep", "30"], dict(os.environ), None, 1, 0, keep={"job_id": "job", "token": "t3"})
        marks = {proc.mark for proc in runtime._procs.values()}
        assert len(marks) == 3
    finally:
        runtime.close(0.5)


def test_an_instance_the_keeper_started_ends_on_sigterm_within_its_grace(tmp_path):
    listener = keeper_lease.listen_at(keeper_lease.socket_path_for(tmp_path / "logs"))
    events: list = []
    runtime = LocalRuntime("job", events.append, "n1")
    try:
        keeper_lease.enable_kept_instances(listener, 5.0)
        listener.close()
        # The keeper catches SIGTERM itself: what it starts must get the default back.
        runtime.start("w", ["sleep", "30"], dict(os.environ), None, 0, 0, keep={"job_id": "job", "token": "t"})
        assert runtime._procs["w"].popen.__class__.__name__ == "KeptProcess"
        runtime.stop(["w"], 5.0)
        [exited] = [e for e in events if isinstance(e, InstanceExited)]
        assert exited.exit_code == 128 + signal.SIGTERM
    finally:
        runtime.close(0.5)


def test_another_user_cannot_reach_the_keepers_socket(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    python = other_python()
    path = keeper_lease.socket_path_for(tmp_path / "logs")
    listener = keeper_lease.listen_at(path)
    try:
        probe = subprocess.run(
            [python, "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
                                   "s.connect(sys.argv[1])", str(path)],
            user=65534, group=65534, extra_groups=[], capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr
    finally:
        listener.close()
