"""The node host: one machine's incarnations, whichever engine started them.
A stop dumps the stacks while the instance is still alive and only then
signals it; a process another engine started is adopted through a plug-in
that knows nothing of Slurm, followed like the host's own (lines, exit with
its tail) and stopped through that plug-in; a start never runs after a
newer incarnation of its instance."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from trainwarden.events import InstanceExited, InstanceSpec, InstanceStarted, LogLine, Stream
from trainwarden.runtime.adoption import Adopted, Announcements, executed_token, token_digest
from trainwarden.runtime.control import ControlServer
from trainwarden.runtime.inbox import Inbox
from trainwarden.runtime.nodehost import NODE_VARIABLES, NodeHost, StartOrder, StopOrder, planned_env
from trainwarden.runtime.stopping import alive, stop_process_groups

from tests.runtime.recording import RecordingOutput

JOB = "job-1"
SPEC = InstanceSpec(name="worker-0", role="worker", index=0, rank=0)


class _ProcessAdopter:
    """Another engine's processes: started by the test, proven by the token
    they were executed with once the actuator announced it."""

    def __init__(self):
        self.announced = Announcements()
        self.unproven: list[int] = []
        self.events: list = []
        self.stopped: list[int] = []

    def expect(self, job_id, incarnations):
        self.announced.expect(job_id, incarnations)

    def poll(self):
        found = []
        for pid in self.unproven:
            token = executed_token(pid)
            incarnation = self.announced.incarnation(token)
            if incarnation is not None:
                found += [Adopted(incarnation, token, pid, key=pid), InstanceStarted(
                    job_id=incarnation.job_id, time=1.0, instance=incarnation.instance, round=incarnation.round,
                    start=incarnation.start, node="n1", pid=pid)]
        self.unproven = [pid for pid in self.unproven if pid not in {item.pid for item in found}]
        found, self.events = found + self.events, []
        return found

    def claims(self, asked):
        return False

    def launch(self, launch):
        raise AssertionError("never claimed")

    def stop(self, stopped, grace_s):
        pids = [item.pid for item in stopped]
        self.stopped.extend(pids)
        stop_process_groups(pids, grace_s)


def _host(tmp_path, inbox, **options) -> tuple[NodeHost, ControlServer]:
    control = ControlServer(deliver=inbox.put, on_refused=lambda reason, raw: None, adopts=True)
    return NodeHost("n1", control, inbox.put, tmp_path / "sdk", line_sink=inbox.offer_line, **options), control


def _order(program: str, round_: int = 0, start: int = 0) -> StartOrder:
    return StartOrder(job_id=JOB, spec=SPEC, command=(sys.executable, "-c", program), round=round_, start=start,
                      world_size=1, max_restarts=3, master_addr="127.0.0.1", master_port=29999)


def _drain_until(host: NodeHost, inbox: Inbox, predicate, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host.poll()
        item = inbox.get(0.05)
        if item is not None:
            host.take(item)
        host.ship()
        if predicate():
            return
    raise AssertionError("timed out")


def test_a_stop_hands_in_the_stacks_while_the_instance_is_alive_and_only_then_ends_it(tmp_path):
    inbox, output, seen = Inbox(), RecordingOutput(), []
    host, control = _host(tmp_path, inbox, output=output,
                          dumps_to=lambda job, report, dumps, missing: seen.append(
                              (report, missing, alive(host.running[(JOB, "worker-0")].pid))))
    try:
        host.start(_order("import time\nprint('up', flush=True)\ntime.sleep(60)"))
        _drain_until(host, inbox, lambda: output.lines == ["up"])
        host.stop(StopOrder(JOB, grace_s=5.0, report_id="report-1"), background=False)
        assert seen == [("report-1", ["no stack tool is configured"], True)]
        _drain_until(host, inbox, lambda: output.exited)
        assert output.exited[0].exit_code == 128 + 15  # SIGTERM, after the dump
        assert output.exited[0].tail == ("up",)
    finally:
        host.close()
        control.close()


def test_a_process_another_engine_started_is_adopted_followed_and_stopped_through_its_engine(tmp_path):
    inbox, output, engine = Inbox(), RecordingOutput(), _ProcessAdopter()
    host, control = _host(tmp_path, inbox, output=output, adopters=[lambda address: engine])
    process = subprocess.Popen(["sleep", "60"], start_new_session=True,
                               env={"PATH": os.environ["PATH"], "TRAINWARDEN_TOKEN": "token-1"})
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True,
                                env={"PATH": os.environ["PATH"], "TRAINWARDEN_TOKEN": "forged"})
    try:
        engine.unproven = [process.pid, stranger.pid]
        host.poll()
        assert host.running == {}  # nothing announced yet: nothing proven
        host.expect(JOB, [("worker-0", 1, 0, token_digest("token-1"))])
        engine.events = [LogLine(job_id=JOB, time=1.0, instance="worker-0", round=1, start=0, text="step 1",
                                 stream=Stream.STDOUT)]
        host.poll()
        assert host.running[(JOB, "worker-0")].adopter is engine
        assert host.running[(JOB, "worker-0")].pid == process.pid and engine.unproven == [stranger.pid]
        host.stop(StopOrder(JOB, grace_s=5.0), background=False)
        assert engine.stopped == [process.pid]
        assert process.wait(5) == -15 and stranger.poll() is None
        engine.events = [InstanceExited(job_id=JOB, time=2.0, instance="worker-0", round=1, start=0, exit_code=143)]
        host.poll()
        host.ship()
        assert [e.pid for e in output.started] == [process.pid] and output.lines == ["step 1"]
        assert [(e.exit_code, e.tail) for e in output.exited] == [(143, ("step 1",))]
        assert (JOB, "worker-0") not in host.running
    finally:
        for proc in (process, stranger):
            proc.kill()
            proc.wait()
        host.close()
        control.close()


def test_a_start_of_an_incarnation_older_than_one_stopped_here_never_runs(tmp_path):
    inbox, output = Inbox(), RecordingOutput()
    host, control = _host(tmp_path, inbox, output=output)
    try:
        assert host.start(_order("print('new')", round_=2, start=2))
        _drain_until(host, inbox, lambda: output.exited)
        host.stop(StopOrder(JOB, grace_s=1.0, incarnations={"worker-0": (3, 3)}), background=False)
        assert not host.start(_order("print('old')", round_=1, start=1))
        assert not host.start(_order("print('stopped')", round_=3, start=3))
        assert host.counters.ignored_commands == 2
        host.ship()
        assert output.lines == ["new"]
    finally:
        host.close()
        control.close()


def test_an_incarnation_another_engine_starts_carries_the_jobs_variables_and_none_of_its_nodes():
    order = StartOrder(job_id=JOB, spec=SPEC, command=("train",), round=2, start=1, world_size=4, max_restarts=3,
                       master_addr="", master_port=0, env={"LR": "0.1"})
    env = planned_env(order, "token-1", "/sdk")
    assert (env["LR"], env["TRAINWARDEN_TOKEN"], env["TRAINWARDEN_RESTART_ROUND"], env["TRAINWARDEN_RESUME"]) == \
        ("0.1", "token-1", "2", "1")
    assert not set(NODE_VARIABLES) & set(env)
    assert env["PYTHONPATH"].startswith("/sdk")
