"""The chaos soak's verdict (bench/soak_check.py) on pinned records: what
counts as a lost or a doubled decision, a wrong outcome, an orphan."""

from __future__ import annotations

import dataclasses

from bench.soak_check import DecisionSeen, HistoryRow, JobSeen, Records, WebhookSeen, check

JOB = "soak-1"


def _run(restarts: int = 1) -> Records:
    """A clean run: start, ``restarts`` restarts (each round started by every
    rank), complete; every decision executed once, rows and webhooks for each."""
    decided = [DecisionSeen("a-start", JOB, "start_job", 0)]
    decided += [DecisionSeen(f"a-restart-{r}", JOB, "restart_job", r) for r in range(restarts)]
    decided += [DecisionSeen("a-complete", JOB, "complete_job", restarts)]
    rows = [HistoryRow(f"a-restart-{r}", JOB, "restart_job", "done") for r in range(restarts)]
    starts = {(rank, r, r): 1 for rank in range(2) for r in range(restarts + 1)}
    hooks = {f"evt-{d.action_id}": d.action_id for d in decided if d.kind != "start_job"}
    return Records(
        decided=tuple(decided), done=tuple((d.action_id, JOB) for d in decided), history=tuple(rows),
        jobs=(JobSeen(JOB, "succeeded", "succeeded", "completed", "", starts),),
        webhooks=tuple(WebhookSeen(w, float(i)) for i, w in enumerate(hooks)), expected_webhooks=hooks)


def _what(findings) -> list[tuple[str, str]]:
    return [(f.what, f.subject) for f in findings]


def test_a_run_where_every_decision_was_executed_once_finds_nothing():
    verdict = check(_run(restarts=2))
    assert verdict.ok, verdict
    assert (verdict.decisions, verdict.executed, verdict.history_rows) == (4, 4, 2)
    assert verdict.webhooks_expected == verdict.webhooks_delivered == 3


def test_a_decision_the_actuator_never_recorded_done_is_lost():
    run = _run()
    run = dataclasses.replace(run, done=tuple(d for d in run.done if d[0] != "a-restart-0"))
    verdict = check(run)
    assert _what(verdict.lost) == [("not executed", "a-restart-0")] and not verdict.doubled


def test_an_action_recorded_done_twice_is_doubled():
    run = _run()
    verdict = check(dataclasses.replace(run, done=run.done + (("a-restart-0", JOB),)))
    assert _what(verdict.doubled) == [("executed twice", "a-restart-0")] and not verdict.lost


def test_a_decision_published_again_under_its_id_by_a_new_processor_is_neither_lost_nor_doubled():
    run = _run()
    verdict = check(dataclasses.replace(run, decided=run.decided + (run.decided[1],)))
    assert verdict.ok and verdict.republished == 1


def test_a_decision_without_its_history_row_or_with_a_row_left_pending_is_lost():
    run = _run(restarts=2)
    rows = (HistoryRow("a-restart-1", JOB, "restart_job", "pending"),)
    verdict = check(dataclasses.replace(run, history=rows))
    assert _what(verdict.lost) == [("no history row", "a-restart-0"), ("history row left pending", "a-restart-1")]


def test_a_history_row_no_decision_stands_for_is_doubled():
    run = _run()
    verdict = check(dataclasses.replace(run, history=run.history + (HistoryRow("a-ghost", JOB, "restart_job",
                                                                               "done"),)))
    assert _what(verdict.doubled) == [("history row without a decision", "a-ghost")]


def test_two_restarts_of_one_round_and_a_round_started_twice_are_doubled():
    run = _run()
    job = dataclasses.replace(run.jobs[0], starts={**run.jobs[0].starts, (1, 1, 1): 2})
    second = DecisionSeen("a-restart-again", JOB, "restart_job", 0)
    verdict = check(dataclasses.replace(run, decided=run.decided + (second,), done=run.done + (("a-restart-again",
                                                                                                JOB),),
                                        history=run.history + (HistoryRow("a-restart-again", JOB, "restart_job",
                                                                          "done"),), jobs=(job,)))
    assert _what(verdict.doubled) == [("restarted twice in one round", JOB), ("incarnation started twice", JOB)]


def test_a_restart_whose_round_never_started_is_lost_and_a_round_nobody_called_for_is_doubled():
    run = _run()
    never = dataclasses.replace(run.jobs[0], starts={k: v for k, v in run.jobs[0].starts.items() if k[1] == 0})
    assert _what(check(dataclasses.replace(run, jobs=(never,))).lost) == [("restart whose round never started", JOB)]
    extra = dataclasses.replace(run.jobs[0], starts={**run.jobs[0].starts, (0, 2, 2): 1})
    assert _what(check(dataclasses.replace(run, jobs=(extra,))).doubled) == [("round started without a restart",
                                                                              JOB)]


def test_a_webhook_never_delivered_is_lost_and_one_delivered_twice_is_doubled_unless_a_notifier_kill_came_between():
    run = _run()
    first, *rest = run.webhooks
    lost = check(dataclasses.replace(run, webhooks=tuple(rest)))
    assert _what(lost.lost) == [("webhook never delivered", first.webhook_id)]
    again = WebhookSeen(first.webhook_id, 5.0)
    doubled = check(dataclasses.replace(run, webhooks=run.webhooks + (again,)))
    assert _what(doubled.doubled) == [("webhook delivered twice", first.webhook_id)]
    across_kill = check(dataclasses.replace(run, webhooks=run.webhooks + (again,), notifier_kills=(2.5,)))
    assert across_kill.ok and across_kill.redelivered == 1


def test_a_job_that_ended_otherwise_than_its_faults_call_for_is_a_wrong_outcome():
    run = _run()
    failed = dataclasses.replace(run.jobs[0], expected="failed", expected_reason="non_retryable_failure",
                                 status="failed", reason="restart_limit_reached")
    verdict = check(dataclasses.replace(run, jobs=(failed,)))
    assert _what(verdict.wrong_outcomes) == [("wrong outcome", JOB)]
    assert "expected failed (non_retryable_failure), got failed (restart_limit_reached)" in \
        verdict.wrong_outcomes[0].detail


def test_decisions_of_other_jobs_on_the_topic_are_not_the_soaks():
    run = _run()
    other = DecisionSeen("b-restart", "someone-else", "restart_job", 0)
    assert check(dataclasses.replace(run, decided=run.decided + (other,))).ok


def test_processes_left_after_their_job_are_orphans():
    verdict = check(dataclasses.replace(_run(), orphans=("4242 soak-1: bash -c",)))
    assert not verdict.ok and _what(verdict.orphans) == [("orphan process", "4242 soak-1: bash -c")]
