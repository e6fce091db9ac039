"""Every product query (the dashboards', `history`'s and `report`'s) on every
backend, over a history written through that backend's writer."""

from __future__ import annotations

import pytest

from trainwarden.store import analytics
from tests.history_seed import JOB_A, JOB_B, seed


@pytest.mark.parametrize("query", analytics.QUERIES, ids=lambda q: q.name)
def test_every_product_query_returns_its_columns_on_every_backend(backend, query):
    info = seed(backend.writer)
    with backend.open_reader() as reader:
        rows = analytics.run(reader, query.name, since=info.start, until=info.end + 1)
    assert rows, query.name
    assert all(tuple(row) == query.column_names for row in rows)


def test_the_job_filter_scopes_every_job_query_to_that_job(backend):
    seed(backend.writer)
    with backend.open_reader() as reader:
        for name in ("fault_list", "stack_suspects", "hang_advice"):
            rows = analytics.run(reader, name, job=JOB_B)
            assert rows and {r["job_id"] for r in rows} == {JOB_B}, name
        assert [j["job_id"] for j in analytics.run(reader, "jobs", job=JOB_A)] == [JOB_A]
        assert len(analytics.run(reader, "job_rounds", job=JOB_A)) == 3


def test_stage_durations_and_goodput_add_up_to_the_jobs_wall_time(backend):
    seed(backend.writer)
    with backend.open_reader() as reader:
        job = analytics.run(reader, "jobs", job=JOB_B)[0]
        goodput = analytics.run(reader, "goodput", job=JOB_B, since=job["submitted"], until=job["finished"])[0]
        rounds = analytics.run(reader, "job_rounds", job=JOB_B)
        mtbf = analytics.run(reader, "mtbf_mttr", job=JOB_B, since=job["submitted"], until=job["finished"])[0]
    wall = job["finished"] - job["submitted"]
    parts = [goodput[k] for k in ("running_s", "detecting_s", "stopping_s", "restarting_s", "queued_s")]
    assert sum(parts) == pytest.approx(wall, abs=1e-6)
    # The seed's restarts: 2 s deciding, 1.5 s stopping, 0.75 s starting, 30 s until the first line.
    assert [(r["detecting_s"], r["stopping_s"], r["restarting_s"], r["queued_s"]) for r in rounds] == [
        (2.0, 1.5, 0.75, 30.0)] * 2
    assert goodput["goodput"] == pytest.approx(parts[0] / wall)
    assert mtbf["failures"] == 3  # two restarts and the final failure
    assert mtbf["mttr_s"] == pytest.approx(34.25)
    assert mtbf["mtbf_s"] == pytest.approx((wall - 2 * 34.25) / 3)


def test_worst_nodes_count_faults_isolations_and_losses(backend):
    seed(backend.writer)
    with backend.open_reader() as reader:
        nodes = {r["node_name"]: r for r in analytics.run(reader, "worst_nodes")}
    assert (nodes["gpu-node-2"]["faults"], nodes["gpu-node-2"]["isolations"]) == (2, 1)
    assert (nodes["gpu-node-3"]["faults"], nodes["gpu-node-3"]["losses"]) == (2, 1)
    assert list(nodes) == ["gpu-node-2", "gpu-node-3", "gpu-node-1"]  # 3, 3 (a tie, by name), 2
