"""`submit` as a newcomer uses it, on real services and a real broker: the
command runs in the directory it was submitted from, and `--follow` ends as
`run` does (summary line, history pointer, the stack report of a hang)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.cluster.processes import ServiceProcesses
from tests.conftest import JOB_PREFIX, ROOT, TRAINWARDEN

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# A script that exists only in the submitter's directory, as in the report of issue 28.
RETRY_ONCE = """import os, sys
print("running in", os.getcwd(), flush=True)
if os.environ["TRAINWARDEN_RESTART_ROUND"] == "0":
    print("RuntimeError: NCCL error: unhandled system error", file=sys.stderr, flush=True)
    sys.exit(1)
"""
HANG = "import time\nprint('step 1', flush=True)\ntime.sleep(300)\n"


@pytest.fixture
def services(tmp_path):
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    s = ServiceProcesses(bootstrap, tmp_path, nodes=1)
    yield s
    s.stop()


def _submit_from(services, directory, *args: str) -> subprocess.CompletedProcess:
    env = dict(services.env, PYTHONPATH=str(ROOT / "pipeline"))
    return subprocess.run([*TRAINWARDEN, "submit", "--follow", *args], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=240)


def test_a_submitted_command_runs_in_the_submitters_directory_and_ends_like_run(services, tmp_path):
    here = tmp_path / "my-project"
    here.mkdir()
    (here / "retry_once.py").write_text(RETRY_ONCE)
    job_id = f"{JOB_PREFIX}{uuid.uuid4().hex[:8]}"
    done = _submit_from(services, here, "--job-id", job_id, "--args", "--enable-job-restart=True", "--",
                        sys.executable, "retry_once.py")
    assert done.returncode == 0, services.logs() + done.stdout[-2000:] + done.stderr[-2000:]
    assert f"running in {here}" in done.stdout and "can't open file" not in done.stdout + done.stderr
    assert (f"trainwarden ▸ job {job_id} succeeded (all_instances_succeeded); 1 job restart. History: "
            f"trainwarden history --job {job_id}") in done.stderr, done.stderr
    jobs = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--job", job_id, "--json"], env=services.env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert '"framework": "pytorch"' in jobs.stdout, jobs.stdout  # a cluster job's framework is recorded


def test_follow_of_a_hang_that_ends_the_job_shows_its_stack_report_and_the_flag_to_enable_restarts(services,
                                                                                                   tmp_path):
    (tmp_path / "hang.py").write_text(HANG)
    job_id = f"{JOB_PREFIX}{uuid.uuid4().hex[:8]}"
    done = _submit_from(services, tmp_path, "--job-id", job_id, "--args",
                        "--enable-job-hang-detection=True --job-hang-interval=3", "--", sys.executable, "hang.py")
    assert done.returncode == 1, services.logs() + done.stderr[-3000:]
    err = done.stderr
    assert "trainwarden ▸ stack report: " in err and f"trainwarden stacks --job {job_id} shows them" in err, err
    assert f"trainwarden ▸ job {job_id} failed (restarts_disabled); 0 job restarts." in err, err
    assert "add --enable-job-restart=True to --args" in err and err.index("stack report") < err.index("failed ("), err
