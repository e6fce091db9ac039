"""The spot scenario on every runtime, from the scenario module's driver: a
job bids, runs, is released when the price crosses its bid, resumes, is
released again when stock runs short, waits while the price is above its
bid, and resumes when it falls again. ``local`` runs it with ``run
--market``, ``agents`` with the cluster's market service; both must write
the spot_transitions rows ``simulate`` derives from the same trace, at the
trace's times, and cost what it says (to 1e-4). Runtimes not wired to the
market yet skip saying so."""

from __future__ import annotations

import dataclasses

import pytest

from tests.scenarios import kube_spot
from tests.scenarios.pinned import KIND as PINNED
from tests.scenarios.runtimes import RUNTIMES, job, run
from trainwarden.events import DecisionKind
from trainwarden.rules.loader import load_rules
from trainwarden.simulation.spot_job import simulate
from trainwarden.spot.market import TraceMarket
from trainwarden.spot.spec import RoleBid, check_bids

# Seconds from the submission, price per instance-hour, stock; the bid is
# 0.5 x on-demand 1.2 = 0.6 for 2 instances.
TRACE = [(0, 0.3, 8),  # at the bid's reach: runs at once
         (3, 0.9, 8),  # the price crosses the bid: released, back to the queue
         (5, 0.3, 8),  # below again: resumes
         (8, 0.3, 1),  # stock short of 2: released
         (10, 0.9, 8),  # stock back, but the price is above the bid: still queued
         (12, 0.4, 8)]  # the price falls again: resumes, and runs to the end
_ROWS: dict[str, list] = {}


def _market(tmp_path, trace=TRACE) -> str:
    rows = "\n".join(f"  - {{time: {t}, instance_type: ecs.g7.xlarge, price: {p}, stock: {s}}}" for t, p, s in trace)
    path = tmp_path / "market.yaml"
    path.write_text("pools:\n  general: {notice_s: 1}\ninstance_types:\n"
                    f"  ecs.g7.xlarge: {{pool: general, on_demand: 1.2}}\nprices:\n{rows}\n")
    return str(path)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_spot_job_released_on_a_price_crossing_and_a_stock_shortage_resumes_when_the_price_falls_again(
        runtime, tmp_path, job_id):
    if runtime == PINNED.name:
        pytest.skip("spot jobs are not wired to the tests' own pinned runtime (it declares no preempt)")
    market = _market(tmp_path)
    definition = job(job_id, tmp_path, "--enable-job-restart=True", "--steps", "36", "--step-s", "0.25")
    definition = dataclasses.replace(definition, spot=(RoleBid(role="worker", instance_type="ecs.g7.xlarge", count=2,
                                                               discount=0.5, price_limit=None),))
    if runtime == "kubernetes":  # one node is the pool's: the job's pods must go there, and only there
        with kube_spot.pool_node("general", job_id) as pods:
            outcome = run(runtime, tmp_path, definition, market=market, timeout_s=120)
        kube_spot.check_pods(pods, outcome)
    else:
        outcome = run(runtime, tmp_path, definition, market=market, timeout_s=120)
    assert outcome.succeeded, (outcome.spot, outcome.texts())
    rows = outcome.spot
    shape = [(r["round"], r["state"], r["action"], r["reason"], r["preemptions"], r["resumes"]) for r in rows]
    assert [s[1] for s in shape] == ["queued", "running", "requeued", "running", "requeued", "running",
                                     "succeeded"], shape
    # SIGTERM first (the pool gives 1 s notice): each worker saved its checkpoint; the next round resumed from it.
    for name in ("worker-0", "worker-1"):
        assert any(t.startswith(f"sigterm: {name} stops") for t in outcome.texts(name, 0)), outcome.texts(name, 0)
        assert any(t.startswith(f"resuming {name} round=1") and "resume=1" in t for t in outcome.texts(name, 1))
    # Never counted as a restart.
    [record] = outcome.jobs
    assert (record["status"], record["rounds"]) == ("succeeded", 0), record

    # The simulator on the same trace, for the job's work as it ran (its time holding the instances).
    provider = TraceMarket.load(market)
    final = rows[-1]
    sim = simulate(definition, load_rules(), provider, check_bids(definition.spot, provider),
                   duration_s=final["held_s"])
    assert [(kind, reason) for _, kind, reason in sim.steps] == [(r["action"], r["reason"]) for r in rows]
    assert sim.states == [r["state"] for r in rows]
    assert (sim.preemptions, sim.resumes) == (final["preemptions"], final["resumes"])
    # At the trace's times (the first row is the submission's queue_job)...
    began = rows[0]["time"]
    for (at, kind, _), row in zip(sim.steps[:-1], rows[:-1]):
        assert abs((row["time"] - began) - at) < 1.0, (kind, row["time"] - began, at)
    # ... and at its cost.
    print(f"{runtime}: paid {final['paid']:.6f} vs simulate {sim.paid:.6f}, on-demand {final['on_demand']:.6f} vs "
          f"{sim.on_demand:.6f}, queued {final['queued_s']:.2f} s vs {sim.queued_s:.2f} s")
    assert abs(final["paid"] - sim.paid) < 1e-4 and abs(final["on_demand"] - sim.on_demand) < 1e-4, (final, sim)
    assert abs(final["queued_s"] - sim.queued_s) < 1.5, (final, sim)
    # `history --costs`, the report and the dashboards give the rows' figures (one query, on every runtime).
    [costs], [reported] = outcome.spot_costs, outcome.reported_spot
    for figure in ("paid", "on_demand", "queued_s", "held_s", "preemptions", "resumes"):
        assert costs[figure] == pytest.approx(final[figure]) == pytest.approx(reported[figure]), figure

    # The same rows on every runtime.
    for other, other_shape in _ROWS.items():
        assert shape == other_shape, f"{runtime} wrote other spot rows than {other}"
    _ROWS[runtime] = shape


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_spot_job_with_fault_tolerance_off_fails_at_the_first_preemption(runtime, tmp_path, job_id):
    if runtime == PINNED.name:
        pytest.skip("spot jobs are not wired to the tests' own pinned runtime (it declares no preempt)")
    market = _market(tmp_path, [(0, 0.3, 8), (3, 0.9, 8), (5, 0.3, 8)])
    definition = job(job_id, tmp_path, "--fault-tolerant-policy=Never", "--steps", "36", "--step-s", "0.25")
    definition = dataclasses.replace(definition, spot=(RoleBid(role="worker", instance_type="ecs.g7.xlarge", count=2,
                                                               discount=0.5, price_limit=None),))
    if runtime == "kubernetes":
        with kube_spot.pool_node("general", job_id) as pods:
            outcome = run(runtime, tmp_path, definition, market=market, timeout_s=90)
        kube_spot.check_none_left(pods)
    else:
        outcome = run(runtime, tmp_path, definition, market=market, timeout_s=90)
    assert outcome.final is not None and outcome.final.kind is DecisionKind.FAIL_JOB, outcome.final
    assert [r["state"] for r in outcome.spot] == ["queued", "running", "failed"], outcome.spot
    [record] = outcome.jobs
    assert (record["status"], record["rounds"]) == ("failed", 0), record
