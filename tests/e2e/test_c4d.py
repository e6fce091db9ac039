"""C4D findings: acted on from the diagnostic channel only (the C4D socket,
written by a process that is not part of the job: this test process)."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import standardwebhooks

from trainwarden.store import open_reader
from tests.conftest import ROOT, TRAINWARDEN
from tests.e2e.helpers import BEHAVE
from tests.notify.conftest import ENV, SECRET, receiver, subscription_yaml  # noqa: F401 - receiver is a fixture

pytestmark = pytest.mark.e2e
ARGS = ("--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=600 "
        "--enable-c4d-hang-detection=True")
ERROR = "[C4D] level=Error kind=RankCommHang rank=1 node=gpu-7 detail=\"allreduce stuck for 190 s\""
WARNING = "C4D: level=Warning, kind=RankNonCommSlow, rank=0, node=gpu-3, detail=compute 3x slower than peers"


def _diagnoses(store, job_id):
    with open_reader(store) as reader:
        return reader.select("SELECT kind, level, trusted, action, node_name FROM diagnoses FINAL "
                             "WHERE job_id = {job_id:String} ORDER BY time", {"job_id": job_id})


def send_c4d(path, lines) -> None:
    """What C4D's collector does: connect to the C4D socket and write lines."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(path))
        conn.sendall("".join(line + "\n" for line in lines).encode())


def forward_c4d(path, lines) -> None:
    """The same through the shipped forwarder, as an operator would run it next to C4D."""
    done = subprocess.run([sys.executable, "-m", "trainwarden.runtime.c4d_source", "--socket", str(path)],
                          input="".join(line + "\n" for line in lines), text=True, capture_output=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "pipeline")))
    assert done.returncode == 0, done.stderr


def _run_with_channel(store, job_id, channel, lines, *behave, extra=(), extra_env=None, collector=send_c4d):
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"),
               TRAINWARDEN_C4D_SOCKET=str(channel), **(extra_env or {}))
    output = channel.with_name(channel.name + ".run-out")
    with open(output, "w") as out_file:
        proc = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--args", ARGS,
                                 "--stop-grace", "1", *extra, "--", sys.executable, BEHAVE, *behave],
                                env=env, cwd=ROOT, stdout=out_file, stderr=subprocess.PIPE, text=True)
        # The run listens from before its instances start: the lines go in
        # once an instance has printed (a fixed sleep lost them when the run
        # started slowly on a loaded machine).
        deadline = time.monotonic() + 60
        while "[worker-" not in output.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        collector(channel, lines)
        _, err = proc.communicate(timeout=120)
    return proc.returncode, output.read_text(), err


def test_a_c4d_error_from_the_channel_isolates_the_node_and_restarts_the_job(store, job_id, tmp_path, history):
    code, out, err = _run_with_channel(store, job_id, tmp_path / "c4d.sock", [ERROR], "--steps", "60",
                                       "--step-s", "0.1", "--fail-rounds", "none")
    assert code == 0, err
    done = [(r["action"], r["error_source"], r["result"]) for r in history(job_id)]
    assert ("restart_job", "c4d", "done") in done
    assert ("isolate_node", "c4d", "unsupported") in done  # one machine: nowhere else to go
    [finding] = _diagnoses(store, job_id)
    assert (finding["kind"], finding["level"], finding["trusted"]) == ("RankCommHang", "Error", True)
    assert finding["action"] == "isolate_node+restart_job" and finding["node_name"] == "gpu-7"


def test_the_same_line_printed_by_the_job_is_only_recorded_as_untrusted(cli, store, job_id, history):
    result = cli("run", "--job-id", job_id, "--nproc", "1", "--args", ARGS, "--", sys.executable, "-c",
                 f"print({ERROR!r})")
    assert result.code == 0, result
    assert history(job_id) == []
    [finding] = _diagnoses(store, job_id)
    assert finding["trusted"] is False and "not the C4D channel" in finding["action"]


def test_a_c4d_warning_notifies_without_isolating(store, job_id, tmp_path, history):
    # Through the shipped forwarder this time, as an operator would run it next to C4D.
    code, out, err = _run_with_channel(store, job_id, tmp_path / "c4d.sock", [WARNING, "C4D level=Bogus kind=X"],
                                       "--steps", "40", "--step-s", "0.1", collector=forward_c4d)
    assert code == 0, err
    assert [(r["action"], r["error_source"]) for r in history(job_id)] == [("notify", "c4d")]
    [finding] = _diagnoses(store, job_id)
    assert finding["action"] == "notify"
    with open_reader(store) as reader:
        assert any("level" in letter["error"] for letter in reader.dead_letters())


def test_a_c4d_warning_reaches_subscribers_as_c4d_warning_and_an_error_printed_by_the_job_does_not(
        store, job_id, tmp_path, receiver):
    hook = receiver()
    directory = tmp_path / "notifications"
    directory.mkdir()
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml("ops", hook.url,
                                                                                            private=True))
    code, out, err = _run_with_channel(
        store, job_id, tmp_path / "c4d.sock", [WARNING], "--steps", "40", "--step-s", "0.1", "--say", ERROR,
        extra=("--notifications", str(directory), "--notify-dir", str(tmp_path / "queue")), extra_env=ENV)
    assert code == 0, err
    payloads = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    types = [p["type"] for p in payloads]
    assert types.count("c4d.warning") == 1 and "node.isolated" not in types, types
    [warning] = [p["data"] for p in payloads if p["type"] == "c4d.warning"]
    assert warning["error_source"] == "c4d" and "RankNonCommSlow" in warning["message"]
    assert types == ["c4d.warning", "job.succeeded"], types
    # The collector may speak before the second instance has printed its line: in any order.
    assert sorted((f["level"], f["trusted"]) for f in _diagnoses(store, job_id)) == [
        ("Error", False), ("Error", False), ("Warning", True)]


def test_a_c4d_log_the_instances_user_can_write_is_refused_at_start_saying_why(cli, job_id, tmp_path):
    log = tmp_path / "c4d.log"
    log.touch()
    result = cli("run", "--job-id", job_id, "--c4d-log", str(log), "--", sys.executable, "-c", "print(1)")
    assert result.code == 2, result
    said = " ".join(result.err.split())
    assert f"--c4d-log {log}" in said and "writable by the user the instances run as" in said, said
    assert "--c4d-socket" in said  # the hint: the channel that works


def test_a_c4d_socket_another_process_listens_on_is_refused_and_a_killed_ones_is_taken_over(tmp_path):
    from trainwarden.runtime.c4d_source import C4DChannelError, C4DSocket
    from trainwarden.runtime.control import ControlServer

    path, lines = tmp_path / "c4d.sock", []
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from trainwarden.runtime.c4d_source import C4DSocket
        from trainwarden.runtime.control import ControlServer
        C4DSocket({str(path)!r}, print, print, ControlServer(deliver=print))
        print("listening", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "pipeline")))
    control = ControlServer(deliver=lambda pending: None)
    try:
        assert holder.stdout.readline().strip() == "listening"
        with pytest.raises(C4DChannelError, match="another process listens on it"):
            C4DSocket(path, lines.append, lambda reason, attempt: None, control)
        holder.kill()
        holder.wait(30)
        assert path.exists()  # left behind by the killed process
        channel = C4DSocket(path, lines.append, lambda reason, attempt: None, control)
        send_c4d(path, [WARNING])
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lines == [WARNING]
        channel.close()
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait(30)
        control.close()
