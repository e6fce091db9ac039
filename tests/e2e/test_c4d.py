"""C4D findings: acted on from the diagnostic channel only."""

import os
import subprocess
import sys
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


def _run_with_channel(store, job_id, c4d_log, lines, *behave, extra=(), extra_env=None):
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"), **(extra_env or {}))
    output = c4d_log.with_name(c4d_log.name + ".run-out")
    with open(output, "w") as out_file:
        proc = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--args", ARGS,
                                 "--c4d-log", str(c4d_log), "--stop-grace", "1", *extra, "--", sys.executable,
                                 BEHAVE, *behave],
                                env=env, cwd=ROOT, stdout=out_file, stderr=subprocess.PIPE, text=True)
        # The run follows the channel from its end, from before its instances
        # start: the lines go in once an instance has printed (a fixed sleep
        # lost them when the run started slowly on a loaded machine).
        deadline = time.monotonic() + 60
        while "[worker-" not in output.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        with open(c4d_log, "a") as handle:
            for line in lines:
                handle.write(line + "\n")
        _, err = proc.communicate(timeout=120)
    return proc.returncode, output.read_text(), err


def test_a_c4d_error_from_the_channel_isolates_the_node_and_restarts_the_job(store, job_id, tmp_path, history):
    log = tmp_path / "c4d.log"
    log.write_text("C4D agent started\n")
    code, out, err = _run_with_channel(store, job_id, log, [ERROR], "--steps", "60", "--step-s", "0.1",
                                       "--fail-rounds", "none")
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
    log = tmp_path / "c4d.log"
    log.touch()
    code, out, err = _run_with_channel(store, job_id, log, [WARNING, "C4D level=Bogus kind=X"], "--steps", "40",
                                       "--step-s", "0.1")
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
    log = tmp_path / "c4d.log"
    log.touch()
    code, out, err = _run_with_channel(
        store, job_id, log, [WARNING], "--steps", "40", "--step-s", "0.1", "--say", ERROR,
        extra=("--notifications", str(directory), "--notify-dir", str(tmp_path / "queue")), extra_env=ENV)
    assert code == 0, err
    payloads = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    types = [p["type"] for p in payloads]
    assert types.count("c4d.warning") == 1 and "node.isolated" not in types, types
    [warning] = [p["data"] for p in payloads if p["type"] == "c4d.warning"]
    assert warning["error_source"] == "c4d" and "RankNonCommSlow" in warning["message"]
    assert types == ["c4d.warning", "job.succeeded"], types
    assert [(f["level"], f["trusted"]) for f in _diagnoses(store, job_id)] == [("Error", False), ("Error", False),
                                                                              ("Warning", True)]
