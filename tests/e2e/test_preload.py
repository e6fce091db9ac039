"""``trainwarden run --preload``: every start and restart of a Python
instance takes a standby interpreter that imported the modules before the
instance existed (runtime/standby.py), on real processes."""

import sys
import textwrap

from tests.e2e.helpers import actions, standby_pids

JOB = textwrap.dedent("""\
    import os, sys, time
    started = time.time()
    probe = sys.modules.get("tw_preload_probe")
    rank, round_ = int(os.environ["RANK"]), int(os.environ["TRAINWARDEN_RESTART_ROUND"])
    print(f"rank {rank} round {round_} pid {os.getpid()} preloaded {probe is not None}"
          f" before_start {probe is not None and probe.IMPORTED_AT < started}"
          f" rank_at_import {probe.RANK_AT_IMPORT if probe else '-'}", flush=True)
    if rank == 0:
        open(os.path.join(os.environ["TW_MARKS"], f"rank0-round{round_}"), "w").close()
    if rank == 1 and round_ == 0:
        # Rank 0 has said its line before the restart stops it.
        while not os.path.exists(os.path.join(os.environ["TW_MARKS"], "rank0-round0")):
            time.sleep(0.01)
        import signal
        os.kill(os.getpid(), signal.SIGKILL)  # retryable: the job restarts
    time.sleep(0.5)
""")
PROBE = "import os, time\nIMPORTED_AT = time.time()\nRANK_AT_IMPORT = os.environ.get('RANK')\n"


def _files(tmp_path):
    (tmp_path / "tw_preload_probe.py").write_text(PROBE)
    (tmp_path / "job.py").write_text(JOB)
    return {"PYTHONPATH": str(tmp_path), "TW_MARKS": str(tmp_path)}


def test_every_start_and_the_restart_take_an_interpreter_that_imported_the_preload_before_the_instance_existed(
        cli, history, job_id, tmp_path):
    env = _files(tmp_path)
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True",
                 "--preload", "tw_preload_probe", "--", sys.executable, str(tmp_path / "job.py"), env=env)
    assert result.code == 0, result
    lines = [line for line in result.out.splitlines() if "] rank " in line]
    assert len(lines) == 4, result.out  # two ranks, two rounds
    for line in lines:
        assert "preloaded True before_start True rank_at_import None" in line, line
    assert actions(history(job_id)) == [("restart_job", "done")]
    assert "ordinary process" not in result.err, result.err


def test_a_command_that_is_not_python_starts_as_an_ordinary_process_and_says_why_once(cli, job_id, tmp_path):
    env = _files(tmp_path)
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--preload", "tw_preload_probe", "--",
                 "bash", "-c", f"exec {sys.executable} {tmp_path / 'job.py'}", env=env)
    assert result.code == 0, result
    said = [line for line in (result.out + result.err).splitlines() if "is not a Python interpreter" in line]
    assert len(said) == 1, result
    assert all("preloaded False" in line for line in result.out.splitlines() if "] rank " in line)


def test_a_preload_module_that_does_not_exist_means_ordinary_starts_said_once(cli, job_id, tmp_path):
    env = _files(tmp_path)
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--preload", "no_such_module_tw", "--",
                 sys.executable, str(tmp_path / "job.py"), env=env)
    said = [line for line in (result.out + result.err).splitlines() if "No module named 'no_such_module_tw'" in line]
    assert result.code == 0 and len(said) == 1, result


def test_a_bad_preload_name_is_refused_naming_the_flag(cli, job_id):
    result = cli("run", "--job-id", job_id, "--preload", "torch;rm -rf", "--", sys.executable, "-c", "pass")
    assert result.code == 2 and "--preload: 'torch;rm -rf' is not a module name" in result.err, result


def test_standbys_are_not_instances_to_hang_detection_or_history_and_none_is_left_after_the_run(
        cli, history, job_id, tmp_path):
    env = _files(tmp_path)
    (tmp_path / "steady.py").write_text(textwrap.dedent("""\
        import os, signal, sys, time
        if os.environ["RANK"] == "1" and os.environ["TRAINWARDEN_RESTART_ROUND"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        for step in range(40):  # 8 s of steps; the spares say nothing all along
            print("step", step, flush=True)
            time.sleep(0.2)
    """))
    result = cli("run", "--job-id", job_id, "--nproc", "2", "--preload", "tw_preload_probe", "--args",
                 "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=2", "--",
                 sys.executable, str(tmp_path / "steady.py"), env=env)
    assert result.code == 0, result
    records = history(job_id)
    assert actions(records) == [("restart_job", "done")], records
    assert {r["instance_name"] for r in records} == {"worker-1"}
    assert standby_pids(job_id) == []
