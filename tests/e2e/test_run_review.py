"""Cases a review found: fast exits, hostile output, signals, floods, and SDK
calls at the edges."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TRAINWARDEN, job_processes
from tests.e2e.helpers import BEHAVE, run_behave

pytestmark = pytest.mark.e2e


def test_many_instances_that_exit_at_once_do_not_hang_the_run(cli, job_id):
    result = cli("run", "--job-id", job_id, "--quiet", "--nproc", "40", "--", "/bin/true", timeout=60)
    assert result.code == 0 and "Traceback" not in result.err, result


def test_instances_that_fail_at_once_are_judged_without_reader_errors(cli, job_id):
    result = cli("run", "--job-id", job_id, "--nproc", "8", "--", "sh", "-c", "exit 1", timeout=60)
    assert result.code == 1, result
    assert "reader error" not in result.err and "Traceback" not in result.err


def test_markup_in_a_custom_message_is_printed_not_interpreted(cli, job_id, history):
    result = run_behave(cli, job_id, "", "--message", "bad regex [/] in config [bold]x", nproc=1)
    assert result.code == 0, result
    assert "bad regex [/] in config [bold]x" in result.err
    assert history(job_id)[0]["error_message"] == "bad regex [/] in config [bold]x"


def test_every_line_is_cut_at_16_kib_even_when_it_arrives_in_one_read(cli, job_id):
    code = "import sys; sys.stdout.write('y' * 40000 + '\\n'); sys.stdout.flush()"
    result = cli("run", "--job-id", job_id, "--", sys.executable, "-c", code)
    assert result.code == 0, result
    [line] = [x for x in result.out.splitlines() if x.startswith("[worker-0] yyy")]
    assert len(line) < 16 * 1024 + 40 and line.endswith("…[line truncated]")
    assert "1 line cut at 16 KiB" in result.err


def test_sighup_stops_every_instance_like_sigterm(store, job_id, cli):
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"))
    proc = subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "2", "--stop-grace", "1", "--",
                             sys.executable, BEHAVE, "--steps", "1000", "--step-s", "0.1"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while len(job_processes(job_id)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    proc.wait(30)
    assert job_processes(job_id) == []
    assert json.loads(cli("history", "--jobs", "--job", job_id, "--json").out)[0]["status"] == "cancelled"


def test_exit_hang_fires_on_time_while_another_instance_floods_its_output(cli, job_id, history):
    flood = ("import os, sys, time\n"
             "if os.environ['RANK'] == '0': sys.exit(0)\n"
             "line = 'x' * 100 + '\\n'\n"
             "while True: sys.stdout.write(line * 100)\n")
    started = time.time()
    result = cli("run", "--job-id", job_id, "--stop-grace", "1", "--nproc", "2", "--args",
                 "--enable-job-exit-hang-detection=True --job-exit-hang-interval=2", "--",
                 sys.executable, "-c", flood, timeout=120)
    assert result.code == 1, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["error_source"] == "exit_hang" and record["reason"] == "restarts_disabled"
    assert time.time() - started < 30


def test_an_async_worker_is_restarted_at_most_max_num_of_job_restart_times(cli, job_id, history):
    result = run_behave(cli, job_id, "--job-execution-mode=Async --fault-tolerant-policy=OnFailure "
                        "--max-num-of-job-restart=2", "--fail-rank", "1", "--fail-at-step", "0",
                        "--steps", "60", "--step-s", "0.1", nproc=2)
    assert result.code == 1, result
    done = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert [r["action"] for r in done] == ["restart_instance", "restart_instance", "fail_job"]
    assert done[-1]["reason"] == "instance_restart_limit_reached"


def test_reset_config_from_the_sdk_shortens_the_hang_interval(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                        "--job-hang-interval=600", "--reset-interval", "2", "--silent-s", "60")
    assert result.code == 0, result
    [record] = [r for r in history(job_id) if r["result"] == "done"]
    reset_at = max(float(x) for x in re.findall(r"reset 2 OK: taken at ([\d.]+)", result.out))
    assert record["error_source"] == "hang" and 2.0 <= record["time"] - reset_at <= 3.0


def test_a_keyword_set_just_before_a_crash_counts_for_that_crash(cli, job_id, history):
    result = run_behave(cli, job_id, "--enable-job-restart=True", "--fail-rank", "1", "--fail-rounds", "0",
                        "--fail-message", "OSError: flaky_storage_backend went away", "--crash-keyword",
                        "flaky_storage_backend")
    assert result.code == 0, result
    [record] = [r for r in history(job_id, "--wide") if r["result"] == "done"]
    assert record["action"] == "restart_job" and record["category"] == "custom_keyword"


def test_an_engine_error_fails_the_job_with_that_reason_and_keeps_the_event(tmp_path, monkeypatch, job_id):
    from trainwarden import engine
    from trainwarden.jobspec import from_command
    from trainwarden.rules.loader import load_rules
    from trainwarden.services import embedded
    from trainwarden.events import InstanceExited
    from trainwarden.store import open_reader, open_writer

    real_step = engine.step

    def broken_step(state, event, now):
        if isinstance(event, InstanceExited):
            raise RuntimeError("simulated engine bug")
        return real_step(state, event, now)

    class Quiet:
        def line(self, event): pass
        def flush(self): pass
        def decision(self, decision): pass
        def info(self, text): pass

    from trainwarden.supervision import intake
    monkeypatch.setattr(intake, "step", broken_step)
    job = from_command([sys.executable, "-c", "raise SystemExit(3)"], 1, "", job_id)
    store = tmp_path / "store"
    result = embedded.EmbeddedRun(job, load_rules(), open_writer(store), Quiet()).run()
    assert result.status == "failed" and result.reason == "engine_error" and result.dead_letters == 1
    with open_reader(store) as reader:
        [letter] = reader.dead_letters()
        assert "simulated engine bug" in letter["error"] and "InstanceExited" in letter["payload"]
        [record] = [r for r in reader.faults(job_id) if r["result"] == "done"]
        assert record["action"] == "fail_job" and record["reason"] == "engine_error"
