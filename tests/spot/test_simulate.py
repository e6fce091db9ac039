"""`trainwarden simulate`: the pure engine on a virtual clock against a market trace."""

from __future__ import annotations

import json

import pytest

from trainwarden.jobspec import load_job_file
from trainwarden.rules.loader import load_rules
from trainwarden.simulation.spot_job import Failure, load_failures, simulate
from trainwarden.spot.market import TraceMarket
from trainwarden.spot.spec import check_bids
from trainwarden.spot.synthetic import write_trace
from trainwarden.yamlsrc import ConfigError
from tests.conftest import ROOT

JOB = ROOT / "examples" / "spot-job.yaml"
MARKET = ROOT / "examples" / "spot-market.yaml"
PACK = load_rules()


def run(duration: float, checkpoint: float = 0.0, failures=(), job_path=JOB, market_path=MARKET):
    job = load_job_file(job_path)
    market = TraceMarket.load(market_path)
    return simulate(job, PACK, market, check_bids(job.spot, market), duration, checkpoint, failures)


def test_the_example_trace_preempts_a_long_job_twice_and_it_finishes_after_the_second_resume():
    result = run(duration=11)
    assert result.status == "succeeded" and result.preemptions == 2 and result.resumes == 2
    assert result.states == ["queued", "running", "requeued", "running", "requeued", "running", "succeeded"]
    # queued 0-2, 6-8, 12-14; running 2-6, 8-12, then 3 s more
    assert result.completion_s == 17 and result.queued_s == 6 and result.held_s == 11
    assert result.restarts == 0


def test_work_since_the_last_checkpoint_is_lost_at_a_preemption():
    assert run(duration=8, checkpoint=0).completion_s == 12
    assert run(duration=8, checkpoint=3).completion_s == 16  # 4 s run, 3 kept; 4 s run, 6 kept; 2 s more


def test_a_short_job_finishes_before_the_first_preemption():
    result = run(duration=3)
    assert result.preemptions == 0 and result.completion_s == 5 and result.states[-1] == "succeeded"


def test_an_injected_retryable_failure_restarts_the_job_and_counts_as_a_restart():
    failure = Failure(time=3, instance="worker-1", exit_code=1,
                      log="RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error")
    result = run(duration=3, checkpoint=1, failures=(failure,))
    # 1 s done at the failure and kept by the checkpoint; 2 s more after the restart
    assert result.restarts == 1 and result.status == "succeeded" and result.completion_s == 5


def test_cost_on_the_virtual_clock_is_the_trace_price_times_the_time_held():
    result = run(duration=3)
    assert result.paid == pytest.approx(2 * 0.3 * 3 / 3600) and result.on_demand == pytest.approx(2 * 1.2 * 3 / 3600)


def test_a_bid_never_met_leaves_the_job_queued_at_the_end_of_the_trace(tmp_path):
    market = write_trace(tmp_path, hours=1, mean=0.9, volatility=0.0)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(JOB.read_text().replace("SpotDiscountLimit: 0.5", "SpotDiscountLimit: 0.1")
                        .replace("train.py", str(ROOT / "examples" / "train.py")))
    result = run(duration=60, job_path=job_path, market_path=market)
    assert result.status == "queued" and result.completion_s is None and result.paid == 0
    assert result.queued_s == pytest.approx(3540)


def test_a_failure_trace_naming_an_unknown_instance_is_refused_with_its_line(tmp_path):
    path = tmp_path / "failures.yaml"
    path.write_text("failures:\n  - {time: 5, instance: worker-9, exit_code: 1}\n")
    with pytest.raises(ConfigError, match=r"failures.yaml:2: the job has no instance 'worker-9'"):
        load_failures(path, {"worker-0", "worker-1"})


def test_a_failure_with_exit_code_zero_is_refused(tmp_path):
    path = tmp_path / "failures.yaml"
    path.write_text("failures:\n  - {time: 5, instance: worker-0, exit_code: 0}\n")
    with pytest.raises(ConfigError, match="'exit_code' of a failure must be from 1 to 255"):
        load_failures(path, {"worker-0"})


def test_the_cli_compares_bids_as_json(cli):
    result = cli("simulate", str(JOB), "--market", str(MARKET), "--duration", "11", "--bid", "0.9", "--json")
    assert result.code == 0, result
    written, high = json.loads(result.out)
    assert written["bid"] == "as written" and written["preemptions"] == 2
    assert high["bid"] == "discount 0.9" and high["preemptions"] == 0 and high["completion_s"] == 11


def test_the_cli_prints_a_table_with_the_states(cli):
    result = cli("simulate", str(JOB), "--market", str(MARKET), "--duration", "11")
    assert result.code == 0, result
    assert "preemptions" in result.out and "queued → running → requeued → running" in result.out


def test_the_cli_refuses_a_bid_off_the_grid_naming_the_flag(cli):
    result = cli("simulate", str(JOB), "--market", str(MARKET), "--bid", "0.35")
    assert result.code == 2 and "--bid must be 0.1 to 0.9 in steps of 0.1" in result.err


def test_the_cli_refuses_a_job_without_spot_roles(cli):
    result = cli("simulate", str(ROOT / "examples" / "job.yaml"), "--market", str(MARKET))
    assert result.code == 2 and "the job has no spot roles" in result.err
