"""`run --log-dir DIR` writes each incarnation's output where and as the agents do."""

import sys

from trainwarden.events import LogLine, Stream
from trainwarden.runtime.launcher import log_file

JOB = ("import os, sys\nprint('out of', os.environ['TRAINWARDEN_INSTANCE'], 'round', "
       "os.environ['TRAINWARDEN_RESTART_ROUND'])\nprint('warning ü', file=sys.stderr)\n"
       "sys.exit(1 if os.environ['TRAINWARDEN_RESTART_ROUND'] == '0' and os.environ['RANK'] == '0' else 0)\n")


def test_each_incarnation_has_its_stdout_and_stderr_file(cli, job_id, tmp_path):
    logs = tmp_path / "logs"
    result = cli("run", "--log-dir", str(logs), "--job-id", job_id, "--nproc", "2",
                 "--args", "--enable-job-restart=True --fault-tolerant-policy=OnFailure", "--", sys.executable, "-c",
                 JOB)
    assert result.code == 0, result
    files = {str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_file()}
    every = {f"{job_id}/worker-{i}/r{r}-s{r}.{s}.log" for i in (0, 1) for r in (0, 1) for s in ("stdout", "stderr")}
    # worker-1's first round may be stopped by the restart before its interpreter printed anything.
    optional = {f"{job_id}/worker-1/r0-s0.{s}.log" for s in ("stdout", "stderr")}
    assert every - optional <= files <= every, sorted(files)
    assert (logs / job_id / "worker-1" / "r1-s1.stdout.log").read_text() == "out of worker-1 round 1\n"
    assert (logs / job_id / "worker-0" / "r0-s0.stderr.log").read_text(encoding="utf-8") == "warning ü\n"


def test_the_layout_is_the_agents(tmp_path):
    # services/agent.py writes LOG_DIR/<job>/<instance>/r<round>-s<start>.<stream>.log (README, Vector).
    line = LogLine(job_id="j", time=0.0, instance="worker-3", round=2, start=5, text="x", stream=Stream.STDERR)
    assert log_file(tmp_path, line.job_id, line.instance, line.round, line.start, line.stream.value) == \
        tmp_path / "j" / "worker-3" / "r2-s5.stderr.log"


def test_an_unusable_log_dir_is_a_usage_error_before_anything_starts(cli, job_id, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("run", "--log-dir", str(blocker / "logs"), "--job-id", job_id, "--", sys.executable, "-c", "")
    assert result.code == 2 and "--log-dir" in result.err and "Traceback" not in result.err, result


def test_a_log_file_size_out_of_range_is_a_usage_error_naming_the_flag(cli, job_id, tmp_path):
    result = cli("run", "--log-dir", str(tmp_path / "logs"), "--log-file-max-mb", "0", "--job-id", job_id, "--",
                 sys.executable, "-c", "")
    assert result.code == 2 and "--log-file-max-mb must be from 1" in result.err, result
    assert "Traceback" not in result.err


def test_the_output_files_of_a_run_rotate_at_the_size_given(cli, job_id, tmp_path):
    logs = tmp_path / "logs"
    flood = "import sys\nfor _ in range(1100):\n    sys.stdout.write('x' * 1023 + '\\n')\n"
    result = cli("run", "--quiet", "--log-dir", str(logs), "--log-file-max-mb", "1", "--log-files-kept", "1",
                 "--job-id", job_id, "--", sys.executable, "-c", flood)
    assert result.code == 0, result
    out = logs / job_id / "worker-0" / "r0-s0.stdout.log"
    assert out.with_name(out.name + ".1").stat().st_size == 1024 * 1024 and out.stat().st_size == 76 * 1024
