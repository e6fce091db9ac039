"""Spot jobs on the ``slurm`` runtime for real: the services as processes on
a real Kafka broker, ``trainwarden market`` on a trace, the agents on the
local Slurm cluster's nodes (n1..n3). A spot job submitted with ``--runtime
slurm`` asks Slurm for nothing while it waits in the bidding queue, is
released with its pool's notice (SIGTERM to its tasks, then its allocation
cancelled), resumes from its checkpoint in a new allocation, and the
history gives the figures ``run --market`` gives. Opt in: TRAINWARDEN_SLURM=1
with SLURM_CONF, and TRAINWARDEN_KAFKA (.ci/run sets all three)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from trainwarden.runtime.slurm.parse import JobState

from tests.cluster.processes import wait_for
from tests.cluster.test_spot_kafka import Watch, job_row, spot_steps, start_market, write_job, write_market
from tests.slurm.test_slurm_runtime import services, slurm  # noqa: F401 - fixtures

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NOTICE_S = 2


class Allocations:
    """The job's Slurm jobs that are held (pending or running), as
    ``scontrol`` lists them every quarter second, on the test's own clock. A
    COMPLETING one has been let go of: Slurm is tearing it down (the CI's
    loaded machine once took more than 1.5 s over it after the cancel)."""

    def __init__(self, slurm, job_id: str):
        self.slurm = slurm
        self.name = f"tw-{job_id}"
        self.seen: list[tuple[float, tuple[int, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def live(self) -> tuple[int, ...]:
        return tuple(sorted(j.job_id for j in self.slurm.jobs(name=self.name)
                            if not j.state.finished and j.state is not JobState.COMPLETING))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.seen.append((time.time(), self.live()))

    def between(self, start: float, end: float) -> set[int]:
        return {job for at, live in self.seen if start <= at <= end for job in live}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _at(watch: Watch, kind: str, nth: int = 0) -> float:
    return [at for at, k in watch.decisions if k == kind][nth]


def _costs(result) -> dict:
    """The one row of ``history --costs --job JOB --json``."""
    assert result.code == 0, result
    [cost] = json.loads(result.out)
    return cost


def test_a_spot_job_on_slurm_holds_no_allocation_while_queued_is_released_after_the_notice_and_resumes_in_a_new_one(
        services, slurm, tmp_path, job_id):
    # Above the bid, below (starts), above (released with notice), below again
    # (resumes). Running 12 s: an allocation, srun and torch's import must be
    # done, and the SIGTERM handler in place, before the notice.
    market = write_market(tmp_path, [(0, 0.9, 8), (4, 0.3, 8), (16, 0.9, 8), (22, 0.3, 8)], notice_s=NOTICE_S)
    watch, allocations = Watch(services, job_id), Allocations(slurm, job_id)
    try:
        start_market(services, market)
        # 20 s of steps: still training at the notice on a quiet machine.
        proc = services.submit(write_job(tmp_path, job_id, steps=100), "--runtime", "slurm", "--market", market)
        out, err = proc.communicate(timeout=180)
    finally:
        watch.close()
        allocations.close()
    assert proc.returncode == 0, (out[-3000:], err[-3000:], services.logs())
    steps = spot_steps(services, job_id)
    assert [s["state"] for s in steps] == ["queued", "running", "requeued", "running", "succeeded"], steps
    assert f"with {NOTICE_S} s notice" in steps[2]["message"], steps[2]
    started, released, resumed = _at(watch, "start_job"), _at(watch, "requeue"), _at(watch, "resume_job")
    # Nothing asked of Slurm while the job waited for the market to allow it.
    assert allocations.between(0, started - 1.0) == set(), allocations.seen
    [first] = allocations.between(started, released)
    # SIGTERM first: the allocation is kept through the notice, in which the workers save their checkpoints...
    assert first in allocations.between(released + 0.3, released + NOTICE_S - 0.3), allocations.seen
    assert re.search(r"SIGTERM, checkpoint saved at step \d+", out), out
    # ... then released: nothing held in Slurm while the job is queued again.
    assert allocations.between(released + NOTICE_S + 1.5, resumed - 0.2) == set(), allocations.seen
    # The next round in an allocation of its own, resuming from the checkpoint.
    assert allocations.between(resumed, time.time()) - {first}, allocations.seen
    assert re.search(r"round 1: .*, resuming at step [1-9]", out), out
    # Never counted as a restart; and the job's end lets go of its allocation.
    row = job_row(services, job_id)
    assert row["status"] == "succeeded" and row["rounds"] == 0, row
    wait_for(lambda: allocations.live() == (), 15, "the job's allocation cancelled once it succeeded")


def test_a_spot_job_on_slurm_with_fault_tolerance_off_fails_at_the_first_preemption(services, slurm, tmp_path, job_id):
    market = write_market(tmp_path, [(0, 0.3, 8), (4, 0.9, 8), (6, 0.3, 8)])
    start_market(services, market)
    proc = services.submit(write_job(tmp_path, job_id, args="--fault-tolerant-policy=Never"), "--runtime", "slurm",
                           "--market", market)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 1, (out[-3000:], err[-3000:])
    assert [s["state"] for s in spot_steps(services, job_id)] == ["queued", "running", "failed"]
    assert job_row(services, job_id)["status"] == "failed"
    allocations = Allocations(slurm, job_id)
    allocations.close()
    wait_for(lambda: allocations.live() == (), 15, "the failed job's allocation cancelled")


def test_history_costs_and_spot_give_for_a_slurm_run_the_figures_they_give_for_run_on_the_same_trace(
        services, slurm, cli, tmp_path, job_id):
    # Released on a price crossing, then on a stock shortage; resumes when both allow again.
    rows = [(0, 0.3, 8), (4, 0.9, 8), (6, 0.3, 8), (10, 0.3, 1), (12, 0.3, 8)]
    market = write_market(tmp_path, rows, notice_s=1)
    start_market(services, market)
    proc = services.submit(write_job(tmp_path, job_id), "--runtime", "slurm", "--market", market)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, (out[-3000:], err[-3000:], services.logs())
    (tmp_path / "local").mkdir()
    local_job = write_job(tmp_path / "local", job_id)  # its own checkpoints
    ran = cli("run", local_job, "--market", market, timeout=150)
    assert ran.code == 0, ran

    store = ("--store", str(services.store))
    on_slurm = {"spot": spot_steps(services, job_id),
                "costs": _costs(cli("history", "--costs", "--job", job_id, "--json", *store))}
    local = {"spot": json.loads(cli("history", "--spot", "--job", job_id, "--json").out),
             "costs": _costs(cli("history", "--costs", "--job", job_id, "--json"))}
    shape = ("round", "state", "action", "reason", "preemptions", "resumes")
    for where, figures in (("slurm", on_slurm), ("local", local)):
        assert [tuple(s[k] for k in shape) for s in figures["spot"]] == [
            tuple(s[k] for k in shape) for s in local["spot"]], where
        assert [s["state"] for s in figures["spot"]] == ["queued", "running", "requeued", "running", "requeued",
                                                         "running", "succeeded"], (where, figures["spot"])
        cost, last = figures["costs"], figures["spot"][-1]
        # --costs is the last transition's figures...
        for key in ("paid", "on_demand", "held_s", "queued_s", "preemptions"):
            assert abs(cost[key] - last[key]) < 1e-4, (where, key, cost, last)
        # ... and the simulator's on the same trace, for the time the job held its instances.
        [sim] = json.loads(cli("simulate", local_job, "--market", market, "--duration", str(cost["held_s"]),
                               "--json").out)
        assert abs(cost["paid"] - sim["paid"]) < 1e-4 and abs(cost["on_demand"] - sim["on_demand"]) < 1e-4, (
            where, cost, sim)
        assert cost["preemptions"] == sim["preemptions"] == 2, (where, cost, sim)
    print(f"slurm: paid {on_slurm['costs']['paid']:.6f} on-demand {on_slurm['costs']['on_demand']:.6f}; "
          f"local: paid {local['costs']['paid']:.6f} on-demand {local['costs']['on_demand']:.6f}")
