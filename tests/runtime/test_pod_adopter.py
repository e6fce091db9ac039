"""The node host hands a start naming a pod to the kubernetes adopter
(runtime/kubernetes/adopt.py), which runs it in that pod's host once it
listens: the incarnation's lines and exit come back through the node host
as its own instances' do, with the node host's token in its environment; a
stop goes through the pod host; a start stopped before its pod listened
never runs. The pod host here is the real program, as a process on this
machine (tests/k8s runs it in real pods)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from trainwarden.events import InstanceSpec
from trainwarden.runtime.control import ControlServer
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.kubernetes.adopt import PodAdopter, adopter
from trainwarden.runtime.kubernetes.node_side import ANSWER_S, POD_UID_VARIABLE, PodHosts
from trainwarden.runtime.nodehost import NodeHost, StartOrder, StopOrder

UID = "5c1b7a9e-0f3d-4e2a-8b6c-9d1e2f3a4b5c"
from tests.runtime.recording import RecordingOutput

JOB = "job-1"
SPEC = InstanceSpec(name="worker-0", role="worker", index=0, rank=0)


@pytest.fixture
def node(tmp_path):
    state = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))  # short: the pod host's socket is in it
    inbox, output = Inbox(), RecordingOutput(lambda line: (line.round, line.text))
    control = ControlServer(deliver=inbox.put, adopts=True)
    host = NodeHost("n1", control, inbox.put, tmp_path / "sdk", output=output, line_sink=inbox.offer_line,
                    adopters=[adopter(state, "n1")])
    pods: list[subprocess.Popen] = []

    def start_pod_host() -> subprocess.Popen:
        env = {**{k: v for k, v in os.environ.items() if k != "AGENT_ONLY"}, POD_UID_VARIABLE: UID,
               "TRAINWARDEN_POD_STATE": str(state)}
        pods.append(subprocess.Popen([sys.executable, "-m", "trainwarden.runtime.kubernetes.pod_host", "--grace",
                                      "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return pods[-1]

    yield host, output, start_pod_host
    for pod in pods:
        pod.kill()
        pod.wait()
    host.close()
    control.close()
    shutil.rmtree(state, ignore_errors=True)


def _order(program: str, round_: int = 0) -> StartOrder:
    return StartOrder(job_id=JOB, spec=SPEC, command=(sys.executable, "-c", program), round=round_, start=0,
                      world_size=1, max_restarts=3, master_addr="127.0.0.1", master_port=29999,
                      env={POD_UID_VARIABLE: UID, "JOB_OWN": "yes"})


def _until(host: NodeHost, predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host.poll()
        host.ship()
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


# Its round, a job variable, a token, whether the agent's own environment leaked in, and where the SDK comes from.
PRINTS = ("import os, trainwarden.sdk.job_monitor as jm; print('round', os.environ['TRAINWARDEN_RESTART_ROUND'], "
          "os.environ['JOB_OWN'], len(os.environ['TRAINWARDEN_TOKEN']) > 20, 'AGENT_ONLY' in os.environ, "
          "jm.__file__.split(os.sep)[-4], flush=True)")


def test_a_start_naming_a_pod_waits_for_its_host_then_runs_there_with_the_node_hosts_token(node, monkeypatch):
    host, output, start_pod_host = node
    monkeypatch.setenv("AGENT_ONLY", "1")  # the agent's own environment: never the pod's
    assert host.start(_order(PRINTS))
    [claimed] = host.adopters
    assert isinstance(claimed, PodAdopter) and host.runtimes == {}  # nothing started on the node itself
    host.poll()
    assert output.started == [] and (JOB, "worker-0") in host.running  # the pod's host does not listen yet
    start_pod_host()
    _until(host, lambda: output.exited)
    # The job's variables, the incarnation's token, nothing of the agent's own environment, and the
    # SDK from the node's copy (a pod's image need not have Trainwarden).
    assert output.lines == [(0, "round 0 yes True False sdk-path")]
    assert output.exited[0].exit_code == 0 and output.exited[0].tail == ("round 0 yes True False sdk-path",)
    assert (JOB, "worker-0") not in host.running


def test_a_restart_stops_the_incarnation_through_its_pod_host_and_runs_the_next_in_the_same_pod(node):
    host, output, start_pod_host = node
    pod = start_pod_host()
    assert host.start(_order("import time; print('up', flush=True); time.sleep(60)"))
    _until(host, lambda: output.lines == [(0, "up")])
    host.stop(StopOrder(JOB, grace_s=5.0, incarnations={"worker-0": (0, 0)}))
    assert host.start(_order(PRINTS, round_=1))  # held until the stop is done
    _until(host, lambda: len(output.exited) == 2)
    assert [(e.round, e.exit_code) for e in output.exited] == [(0, 128 + 15), (1, 0)]
    assert output.lines[-1] == (1, "round 1 yes True False sdk-path")
    assert pod.poll() is None  # the same pod host: restarted in place


def test_a_start_stopped_before_its_pod_listened_never_runs(node):
    host, output, start_pod_host = node
    assert host.start(_order("print('must not run', flush=True)"))
    host.stop(StopOrder(JOB, grace_s=2.0), background=False)
    _until(host, lambda: output.exited)
    assert output.exited[0].exit_code == 128 + 15
    start_pod_host()
    time.sleep(1.0)  # the pod host listens: nothing may be handed to it now
    host.poll()
    host.ship()
    assert output.lines == [] and len(output.exited) == 1


def test_a_pod_host_that_goes_away_during_a_stop_ends_its_incarnation_as_killed(node):
    host, output, start_pod_host = node
    pod = start_pod_host()
    assert host.start(_order("import time; print('up', flush=True); time.sleep(60)"))
    _until(host, lambda: output.lines == [(0, "up")])
    pod.kill()  # the pod is deleted under it (its node lost): its host never writes the exit
    pod.wait()
    directory = host.adopters[0].hosts.directory(UID)
    (directory / "host.sock").unlink()
    try:
        host.stop(StopOrder(JOB, grace_s=1.0), background=False)
        _until(host, lambda: output.exited)
        assert output.exited[0].exit_code == 128 + 9
    finally:  # the orphan a killed pod's kernel would have ended with it
        os.killpg(json.loads((directory / "r0s0.start.json").read_text())["pid"], signal.SIGKILL)


def test_a_pod_host_that_takes_the_start_but_never_answers_does_not_hold_up_the_agents_loop(node):
    host, output, _ = node
    directory = host.adopters[0].hosts.directory(UID)
    directory.mkdir(parents=True)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts connections, answers none
    silent.bind(str(directory / "host.sock"))
    silent.listen(8)
    try:
        assert host.start(_order("print('never')"))
        slowest = 0.0
        deadline = time.monotonic() + ANSWER_S + 10
        while not output.exited and time.monotonic() < deadline:
            began = time.monotonic()
            host.poll()
            host.ship()
            slowest = max(slowest, time.monotonic() - began)
            time.sleep(0.05)
        assert slowest < 1.0, slowest  # the agent's loop went on: heartbeats, other jobs' lines
        [exited] = output.exited
        assert exited.exit_code == 127 and "does not answer" in output.lines[-1][1], output.lines
    finally:
        silent.close()
