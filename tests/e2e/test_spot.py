"""Spot jobs end to end: real processes, a market trace, the history, and the simulator."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap

import pytest
import standardwebhooks

from tests.conftest import ROOT
from tests.notify.conftest import ENV, SECRET, receiver, subscription_yaml  # noqa: F401 - receiver is a fixture
from trainwarden.cli.market_cmd import spot_runtimes

pytestmark = pytest.mark.e2e

TRAIN = ROOT / "examples" / "train.py"
FT_ON = "--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=1 --max-num-of-same-error=1"
# Crosses the bid (0.5 x 1.2 = 0.6) twice: up at 6 s and 12 s, back down at 8 s and 14 s.
TWICE = [(0, 0.7), (2, 0.3), (6, 0.8), (8, 0.3), (12, 0.9), (14, 0.35)]


def write_job(tmp_path, job_id: str, args: str = FT_ON, steps: int = 40, discount: float = 0.5) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        job_id: {job_id}
        args: {args}
        stop_grace_s: 3
        checkpoint_dir: ckpt/{{job_id}}
        env: {{STEPS: "{steps}", STEP_S: "0.2", CHECKPOINT_EVERY: "1"}}
        roles:
          worker:
            count: 2
            command: [python3, "{TRAIN}"]
            spot:
              SpotStrategy: SpotWithPriceLimit
              SpotDiscountLimit: {discount}
              instance_type: ecs.g7.xlarge
        """))
    return str(path)


def write_market(tmp_path, prices, notice_s: float = 0) -> str:
    rows = "\n".join(f"  - {{time: {t}, instance_type: ecs.g7.xlarge, price: {p}, stock: 8}}" for t, p in prices)
    path = tmp_path / "market.yaml"
    path.write_text(f"pools:\n  general: {{notice_s: {notice_s}}}\ninstance_types:\n"
                    f"  ecs.g7.xlarge: {{pool: general, on_demand: 1.2}}\nprices:\n{rows}\n")
    return str(path)


def spot_steps(cli, job_id: str) -> list[dict]:
    result = cli("history", "--job", job_id, "--spot", "--json")
    assert result.code == 0, result
    return json.loads(result.out)


def resumed_at(out: str) -> dict[int, int]:
    """Round -> the step rank 0 resumed (or started) at."""
    return {int(r): int(s) for r, s in re.findall(r"^\[worker-0\] rank 0/2 round (\d+): .*? at step (\d+)", out, re.M)}


def test_a_spot_job_preempted_twice_is_requeued_resumes_from_its_checkpoint_and_succeeds(cli, job_id, history,
                                                                                       tmp_path, receiver):
    job, market = write_job(tmp_path, job_id), write_market(tmp_path, TWICE)
    hook = receiver()
    subscriptions = tmp_path / "notifications"
    subscriptions.mkdir()
    (subscriptions / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", hook.url, private=True, rate=0))
    result = cli("run", job, "--market", market, "--notifications", str(subscriptions), "--notify-dir",
                 str(tmp_path / "queue"), timeout=120, env=ENV)
    assert result.code == 0, result
    events = [standardwebhooks.Webhook(SECRET).verify(r.body, r.headers) for r in hook.requests]
    assert [e["type"] for e in events] == ["job.requeued", "job.resumed", "job.requeued", "job.resumed",
                                           "job.succeeded"]
    assert [e["data"]["details"]["cost"]["preemptions"] for e in events] == [1, 1, 2, 2, 2]
    assert events[-1]["data"]["details"]["cost"]["paid"] < events[-1]["data"]["details"]["cost"]["on_demand"]
    records = history(job_id)
    preemptions = [r for r in records if r["error_source"] == "preemption"]
    assert [(r["action"], r["result"]) for r in preemptions] == [("requeue", "done"), ("requeue", "done")]
    assert not [r for r in records if r["action"] in ("restart_job", "restart_instance", "fail_job")]
    # The restart limits are untouched: no job restart was counted.
    [row] = json.loads(cli("history", "--jobs", "--job", job_id, "--json").out)
    assert row["status"] == "succeeded" and row["rounds"] == 0
    # Each round after a preemption resumes where the checkpoint left it: the step counter continues.
    starts = resumed_at(result.out)
    assert sorted(starts) == [0, 1, 2] and 0 == starts[0] < starts[1] < starts[2] < 40, result.out
    assert "round 1: " in result.out and re.search(r"round 1: .*, resuming at step", result.out)
    steps = spot_steps(cli, job_id)
    assert [s["state"] for s in steps] == ["queued", "running", "requeued", "running", "requeued", "running",
                                           "succeeded"]
    [cost] = json.loads(cli("history", "--costs", "--job", job_id, "--json").out)
    assert cost["preemptions"] == 2 and 0 < cost["paid"] < cost["on_demand"]
    assert 5 < cost["queued_s"] < 8 and cost["held_s"] > 8

    # The simulator, on the same job and trace, agrees on preemptions and the order of states.
    simulated = cli("simulate", job, "--market", market, "--duration", "11", "--json")
    assert simulated.code == 0, simulated
    [sim] = json.loads(simulated.out)
    assert sim["preemptions"] == cost["preemptions"] == 2
    assert sim["states"] == [s["state"] for s in steps]


def test_with_fault_tolerance_off_a_spot_job_fails_at_the_first_preemption(cli, job_id, history, tmp_path):
    job = write_job(tmp_path, job_id, args="--fault-tolerant-policy=Never")
    result = cli("run", job, "--market", write_market(tmp_path, TWICE), timeout=60)
    assert result.code == 1, result
    [record] = [r for r in history(job_id, "--wide") if r["error_source"] == "preemption"]
    assert record["action"] == "fail_job" and record["reason"] == "preempted"
    assert [s["state"] for s in spot_steps(cli, job_id)] == ["queued", "running", "failed"]
    assert "round 1" not in result.out


def test_a_job_bidding_under_the_price_waits_queued_and_starts_when_the_trace_allows(cli, job_id, tmp_path):
    job = write_job(tmp_path, job_id, steps=3)
    result = cli("run", job, "--market", write_market(tmp_path, [(0, 0.7), (3, 0.65), (4, 0.5)]), timeout=60)
    assert result.code == 0, result
    queued, running, done = spot_steps(cli, job_id)
    assert (queued["state"], running["state"], done["state"]) == ("queued", "running", "succeeded")
    assert 3.8 <= running["time"] - queued["time"] < 5.5 and running["queued_s"] >= 3.8
    assert "starting at step 0" in result.out


def test_with_a_notice_period_instances_get_sigterm_and_checkpoint_before_the_release(cli, job_id, history,
                                                                                       tmp_path):
    job = write_job(tmp_path, job_id, steps=20)
    market = write_market(tmp_path, [(0, 0.3), (2, 0.9), (4, 0.3)], notice_s=2)
    result = cli("run", job, "--market", market, timeout=60)
    assert result.code == 0, result
    assert "SIGTERM, checkpoint saved at step" in result.out
    [record] = [r for r in history(job_id) if r["error_source"] == "preemption"]
    assert "with 2 s notice" in record["error_message"]
    saved = int(re.search(r"\[worker-0\] step \d+: SIGTERM, checkpoint saved at step (\d+)", result.out).group(1))
    assert resumed_at(result.out)[1] == saved


def test_a_job_with_spot_roles_needs_a_market(cli, job_id, tmp_path):
    result = cli("run", write_job(tmp_path, job_id))
    assert result.code == 2 and "the job has spot roles (worker) but no market" in result.err


def test_a_market_for_a_job_without_spot_roles_is_refused(cli, tmp_path):
    result = cli("run", str(ROOT / "examples" / "job.yaml"), "--market", write_market(tmp_path, TWICE))
    assert result.code == 2 and "--market is for jobs with spot roles" in result.err


def test_a_price_limit_in_a_discount_only_pool_is_refused_before_anything_starts(cli, job_id, tmp_path):
    job = write_job(tmp_path, job_id)
    market = tmp_path / "market.yaml"
    market.write_text("pools:\n  lingjun: {discount_only: true}\ninstance_types:\n"
                      "  ecs.g7.xlarge: {pool: lingjun, on_demand: 1.2}\n"
                      "prices:\n  - {time: 0, instance_type: ecs.g7.xlarge, price: 0.3, stock: 8}\n")
    (tmp_path / "job.yaml").write_text(open(job).read().replace("SpotDiscountLimit: 0.5", "SpotPriceLimit: 0.6"))
    result = cli("run", job, "--market", str(market))
    assert result.code == 2 and "job.yaml:12:" in result.err and "accepts only 'SpotDiscountLimit'" in result.err


def test_every_runtime_submit_takes_declares_the_preempt_that_releases_a_spot_job():
    from trainwarden.runtime.registry import submitted

    assert sorted(spot_runtimes()) == sorted(kind.name for kind in submitted()) == ["agents", "kubernetes", "slurm"]


def test_a_spot_job_for_a_runtime_that_cannot_release_it_is_refused_rather_than_run_on_ordinary_capacity(
        monkeypatch, tmp_path, job_id):
    from trainwarden.cli import market_cmd
    from trainwarden.jobspec import load_job_file

    monkeypatch.setattr(market_cmd, "spot_runtimes", lambda: ("agents",))  # a runtime that declares no preempt
    job = dataclasses.replace(load_job_file(write_job(tmp_path, job_id)), runtime="slurm")
    bids, (error, hint) = market_cmd.spot_bids(job, write_market(tmp_path, [(0, 0.3)]))
    assert bids == () and "the slurm runtime is not wired to the market yet" in error and "--runtime agents" in hint


def test_a_spot_job_submitted_without_a_market_to_check_its_bids_is_refused(cli, job_id, tmp_path):
    result = cli("submit", write_job(tmp_path, job_id), "--bootstrap", "127.0.0.1:1")
    assert result.code == 2 and "no --market to check its bids against" in result.err, result
