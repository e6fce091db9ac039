"""The pod host (what each pod's container runs) and the node's side that
drives it, as processes on this machine: incarnations one after the other in
the same host process, their lines and exits, a stop, the pod's end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainwarden.events import InstanceExited, InstanceStarted, LogLine
from trainwarden.runtime.kubernetes.node_side import PodHostError, PodHosts

UID = "0d6f1c8e-5b7a-4c1e-9a57-3f0c2d9b1e42"


@pytest.fixture
def pod_host():
    # A short directory: a Unix socket's path is at most 107 bytes (a node's state directory is short too).
    tmp_path = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))
    env = {**os.environ, "TRAINWARDEN_POD_UID": UID, "TRAINWARDEN_POD_STATE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "trainwarden.runtime.kubernetes.pod_host", "--grace", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    hosts = PodHosts(tmp_path, "n1", clock=time.monotonic)
    deadline = time.monotonic() + 20
    while not hosts.ready(UID) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc, hosts
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    shutil.rmtree(tmp_path, ignore_errors=True)


def _until_exit(hosts, timeout=20.0):
    events = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += hosts.poll()
        if any(isinstance(e, InstanceExited) for e in events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"no exit within {timeout} s: {events}")


def test_incarnations_run_one_after_the_other_in_the_same_pod_host_with_their_own_lines_and_exits(pod_host):
    proc, hosts = pod_host
    script = "import os,sys; print('round', os.environ['TRAINWARDEN_RESTART_ROUND']); print('oops', file=sys.stderr); sys.exit(3)"
    hosts.run(UID, "job", "worker-0", 0, 0, [sys.executable, "-c", script], {"TRAINWARDEN_RESTART_ROUND": "0",
                                                                             "TRAINWARDEN_TOKEN": "t0"})
    first = _until_exit(hosts)
    assert isinstance(first[0], InstanceStarted) and first[0].node == "n1"
    assert [e.text for e in first if isinstance(e, LogLine)] == ["round 0", "oops"]
    assert first[-1] == InstanceExited(job_id="job", time=first[-1].time, instance="worker-0", round=0, start=0,
                                       exit_code=3)
    hosts.run(UID, "job", "worker-0", 1, 0, [sys.executable, "-c", script], {"TRAINWARDEN_RESTART_ROUND": "1",
                                                                             "TRAINWARDEN_TOKEN": "t1"})
    second = _until_exit(hosts)
    assert [e.text for e in second if isinstance(e, LogLine)] == ["round 1", "oops"]
    assert {(e.round, e.start) for e in second} == {(1, 0)}
    assert proc.poll() is None  # the same host process: in place


def test_a_stop_ends_the_incarnation_by_sigterm_and_the_pods_end_ends_the_host_cleanly(pod_host):
    proc, hosts = pod_host
    hosts.run(UID, "job", "worker-0", 0, 0, [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
              {"TRAINWARDEN_TOKEN": "t"})
    hosts.stop(UID, grace_s=5)
    events = _until_exit(hosts)
    assert events[-1].exit_code == 128 + signal.SIGTERM
    hosts.run(UID, "job", "worker-0", 1, 0, [sys.executable, "-c", "import time; time.sleep(60)"], {})
    proc.send_signal(signal.SIGTERM)  # Kubernetes stops the pod
    assert proc.wait(20) == 0
    assert _until_exit(hosts)[-1].exit_code == 128 + signal.SIGTERM


def test_a_malformed_run_is_refused_in_a_sentence_and_the_host_goes_on(pod_host):
    proc, hosts = pod_host
    with pytest.raises(PodHostError, match="'command' is not a list of strings"):
        hosts.run(UID, "job", "worker-0", 0, 0, [], {})
    hosts.run(UID, "job", "worker-0", 0, 1, [sys.executable, "-c", "pass"], {})
    assert _until_exit(hosts)[-1].exit_code == 0


def test_a_command_that_does_not_exist_exits_127_with_a_line_saying_why(pod_host):
    proc, hosts = pod_host
    hosts.run(UID, "job", "worker-0", 0, 0, ["/nonexistent/python"], {})
    events = _until_exit(hosts)
    assert events[-1].exit_code == 127
    assert any("cannot start '/nonexistent/python'" in e.text for e in events if isinstance(e, LogLine))


def test_the_containers_oom_kills_and_memory_limit_are_read_from_cgroup_v1_or_v2(tmp_path):
    from trainwarden.runtime.kubernetes.pod_host import memory_limit, oom_kills

    v1, v2 = tmp_path / "memory.oom_control", tmp_path / "memory.events"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    v2.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    missing = str(tmp_path / "absent")
    assert oom_kills((missing, str(v1))) == 3 and oom_kills((str(v2),)) == 2 and oom_kills((missing,)) is None
    limit, unlimited_v1, unlimited_v2 = (tmp_path / name for name in ("limit", "v1max", "v2max"))
    limit.write_text("209715200\n")
    unlimited_v1.write_text("9223372036854771712\n")
    unlimited_v2.write_text("max\n")
    assert memory_limit((str(limit),)) == 200 * 2**20
    assert memory_limit((str(unlimited_v1),)) == memory_limit((str(unlimited_v2),)) == memory_limit((missing,)) == 0
