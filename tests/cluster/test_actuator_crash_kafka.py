"""Issue 29, break 2: an actuator that dies in the middle of a restart, on a
real broker (TRAINWARDEN_KAFKA), services as processes.

The actuator dies at each step of the job's one restart: after its intent
record, between the stop and the start commands, and after the commands but
before its ``action_done``. A test hook kills it there (``failpoint.py``:
``os._exit`` at the named point, what it sent before on the broker): the
steps are milliseconds apart, a SIGKILL from outside would land on one of
them by chance. The next actuator must finish that restart, not do it again:
one new round (each instance's round-1 incarnation started once, no round
2), one fault row, and the jobs table counting one restart although the
actuator that did it is gone.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.cluster.processes import behave, services_on_broker, wait_for
from tests.conftest import TRAINWARDEN
from trainwarden import failpoint

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
STEPS = ["after-intent", "between-stop-and-start", "before-done"]


@pytest.fixture
def services(tmp_path):
    yield from services_on_broker(tmp_path)


def _jobs(services, job_id: str, check: bool = True) -> list[dict]:
    out = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--job", job_id, "--json", "--store",
                          str(services.store)], env=services.env, capture_output=True, text=True, timeout=60)
    if not check and out.returncode != 0:
        return []  # no store, or no such job, yet
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("step", STEPS)
def test_an_actuator_killed_at_any_step_of_a_restart_leaves_one_new_round_and_one_fault_row(services, job_id,
                                                                                             step):
    services.kill("actuator")
    services.start("actuator", env={failpoint.ENV: f"{step}:restart_job"})
    # Worker-1 fails once, in round 0; round 1 runs long enough for the next
    # actuator to meet it running.
    proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--",
                           *behave("--steps", "150", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0",
                                   "--fail-at-step", "5", "--fail-message", NCCL))
    try:
        code = services.procs["actuator"].wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the actuator never reached {step}:restart_job\n" + services.logs()) from None
    assert code == failpoint.EXIT_CODE, services.logs()
    services.start("actuator")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]

    hellos = sorted(re.findall(r"hello (worker-\d) rank=\d+ round=(\d+) start=(\d+)", out))
    assert hellos == [("worker-0", "0", "0"), ("worker-0", "1", "1"), ("worker-1", "0", "0"),
                      ("worker-1", "1", "1")], out[-4000:]
    faults = services.history(job_id)
    assert [(r["action"], r["round"], r["result"]) for r in faults] == [("restart_job", 0, "done")], faults
    [job] = _jobs(services, job_id)
    assert (job["status"], job["rounds"]) == ("succeeded", 1), job
    assert "finishing restart_job" in (services.tmp / "actuator.log").read_text(), services.logs()


def test_the_jobs_table_counts_a_restart_whose_actuator_is_gone(services, job_id):
    proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "--enable-job-restart=True", "--",
                           *behave("--steps", "120", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0",
                                   "--fail-at-step", "5", "--fail-message", NCCL))
    # Counted while the job runs, not only once it is over...
    wait_for(lambda: [(j["status"], j["rounds"]) for j in _jobs(services, job_id, check=False)] == [("running", 1)], 90,
             "the jobs table to count the restart of a running job")
    # ...and by an actuator that never saw the restart: the one that did it is gone.
    services.kill("actuator")
    services.start("actuator")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    [job] = _jobs(services, job_id)
    assert (job["status"], job["rounds"]) == ("succeeded", 1), job
    listed = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--job", job_id, "--store", str(services.store)],
                            env=services.env, capture_output=True, text=True, timeout=60)
    row = next(line for line in listed.stdout.splitlines() if job_id in line)
    assert re.search(r"succeeded\s.*\s2\s+1\s", row), listed.stdout  # instances 2, restarts 1
