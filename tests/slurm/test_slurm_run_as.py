"""The ``slurm`` runtime with the actuator's ``--run-as`` (SlurmCli's run_as),
on the real Slurm of deploy/slurm/local-slurm (TRAINWARDEN_SLURM=1 and
SLURM_CONF, as tests/scenarios): the allocation and its steps run as uid
65534, not as the actuator's root, and the job still restarts, resumes and
has its stacks dumped; a job hunting for the services' key finds nothing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.other_user import OTHER_GID, OTHER_UID, other_python, other_writable, python_path
from tests.scenarios.runtimes import job, run, slurm_site
from trainwarden.events import LogLine
from trainwarden.jobspec import from_command
from trainwarden.runtime.run_as import resolve

ROOT = Path(__file__).resolve().parents[2]
HUNTER = ROOT / "tests" / "e2e" / "programs" / "key_hunter.py"
NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
KEY = "k1" * 8 + "0123456789abcdef0123456789abcdef"


@pytest.fixture
def site(monkeypatch):
    """A Slurm site whose jobs run as uid 65534, its directory outside
    pytest's tree (which only root may enter), as a site's shared one."""
    python = other_python()  # skips where jobs cannot run as another user
    # srun passes the actuator's environment to the task wrappers: they import this checkout.
    monkeypatch.setenv("PYTHONPATH", python_path())
    directory = Path(tempfile.mkdtemp(prefix="tw-slurm-run-as-"))
    os.chmod(directory, 0o755)
    checkpoints = other_writable()
    try:
        yield slurm_site(directory, run_as=resolve(str(OTHER_UID)), python=python), checkpoints
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(checkpoints, ignore_errors=True)


def _uids_of_job(job_id: str) -> dict[int, tuple[str, str]]:
    """Every process started with this job's id in its environment: its
    Uid line and its parent's (the task wrapper's)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"TRAINWARDEN_JOB_ID={job_id}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
            parent = Path(f"/proc/{status['PPid'].strip()}/status").read_text()
        except (OSError, KeyError):
            continue
        parent_uid = next(line.split(":", 1)[1] for line in parent.splitlines() if line.startswith("Uid:"))
        found[int(proc.name)] = (" ".join(status["Uid"].split()), " ".join(parent_uid.split()))
    return found


def test_a_slurm_job_run_as_another_user_runs_as_that_user_and_a_retryable_crash_restarts_and_resumes(
        site, job_id, tmp_path):
    slurm, checkpoints = site
    seen: dict[int, tuple[str, str]] = {}

    def look(line: LogLine):
        if line.text.startswith(("starting", "resuming")):
            seen.update(_uids_of_job(job_id))
        return None

    definition = job(job_id, checkpoints, "--enable-job-restart=True", "--fail-rank", "1", "--fail-at-step", "2",
                     "--fail-message", NCCL, "--steps", "5", python=other_python())
    outcome = run("slurm", tmp_path, definition, trigger=look, slurm=slurm)
    assert outcome.succeeded, outcome.texts()
    [restart] = [r for r in outcome.faults if r["result"] != "pending"]
    assert (restart["action"], restart["error_source"], restart["result"]) == ("restart_job", "instance_exit", "done")
    assert any(t.startswith("resuming worker-1 round=1 at step 2 resume=1") for t in outcome.texts("worker-1", 1))
    # The instances and their task wrappers, in both rounds, ran as uid 65534 (real, effective, saved, fs).
    mine = f"{OTHER_UID} {OTHER_UID} {OTHER_UID} {OTHER_UID}"
    assert len(seen) >= 2 and set(seen.values()) == {(mine, mine)}, seen
    # What the tasks wrote, Slurm wrote as the job's user: the allocation was the user's.
    outputs = slurm.directory / "outputs"
    assert {p.stat().st_uid for p in outputs.glob("*-step*-task*.out")} == {OTHER_UID}
    # The plans (the tokens) are the actuator's, readable by the user's group, by nobody else.
    plans = list((slurm.directory / job_id).glob("plan-*.json"))
    assert plans and {(p.stat().st_uid, p.stat().st_gid, p.stat().st_mode & 0o777) for p in plans} == {
        (0, OTHER_GID, 0o640)}


def test_a_hung_slurm_job_run_as_another_user_still_gets_its_stacks_dumped_and_restarts(site, job_id, tmp_path):
    slurm, checkpoints = site
    definition = job(job_id, checkpoints, "--enable-job-restart=True --enable-job-hang-detection=True "
                     "--job-hang-interval=3", "--hang-round", "0", "--hang-at-step", "2", "--steps", "4",
                     python=other_python())
    outcome = run("slurm", tmp_path, definition, slurm=slurm)
    assert outcome.succeeded, outcome.texts()
    [restart] = [r for r in outcome.faults if r["result"] != "pending"]
    assert (restart["action"], restart["error_source"]) == ("restart_job", "hang")
    # py-spy, run by the root agent, reads the stacks of the non-root instances.
    [report] = outcome.stacks
    assert report["round"] == 0 and report["processes"] == 2 and report["missing"] == "", report


def test_a_slurm_job_that_hunts_every_environ_and_the_key_file_finds_nothing(site, job_id, tmp_path):
    slurm, checkpoints = site
    # A key only root may read, where a site keeps its services' files, beside the Slurm directory.
    key_file = slurm.directory.parent / "keyring"
    key_file.write_text(json.dumps({"keys": {"k1": KEY}}))
    key_file.chmod(0o600)
    report, pwned = checkpoints / "report.json", checkpoints / "PWNED"
    # The shell waits first: an agent adopts a task by its process's environment, which a
    # task gone within a second no longer has (the hunt itself takes a fraction of one).
    definition = from_command(["/bin/sh", "-c", 'sleep 2 && exec "$0" "$@"', other_python(), str(HUNTER), "--report", str(report), "--pwned", str(pwned),
                               "--nodes", "n1,n2,n3", "--search", str(slurm.directory), "--key-file",
                               str(key_file), "--path", python_path()], 1, "", job_id, stop_grace_s=2)
    outcome = run("slurm", tmp_path, definition, slurm=slurm)
    assert outcome.succeeded and report.exists(), outcome.texts()
    hunt = json.loads(report.read_text())
    # Slurm gives the user its own groups (initgroups): those of uid 65534, none of root's.
    assert hunt["uid"] == OTHER_UID and set(hunt["groups"]) <= {OTHER_GID}, hunt
    # It read its own environ; those of the agents, the actuator and Slurm's root daemons were refused.
    assert hunt["read"]["environ"] >= 1 and hunt["refused"]["environ"] >= 4, hunt
    assert (hunt["found"], hunt["sent"], pwned.exists()) == ([], 0, False), hunt
