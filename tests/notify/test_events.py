"""The event vocabulary: which engine decisions become which events, and the payload."""

import ast
import json
import pathlib

import msgspec
import pytest

from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason
from trainwarden.notify.events import (
    EVENT_TYPES,
    MAX_DETAILS_BYTES,
    SCHEMA_VERSION,
    event_id,
    events_from_decision,
    sample_event,
)
from tests.engine.test_spot import SpotJob, offer
from tests.notify.conftest import crash_then_nan_decisions


def decision(kind, reason, source=None, **fields) -> Decision:
    base = dict(rule="r", job_id="j1", time=1_764_400_000.25, round=2, action_id="a1b2", error_source=source,
                instance="worker-1", node="node-a")
    base.update(fields)
    return Decision(kind=kind, reason=reason, **base)


CASES = [
    (decision(DecisionKind.RESTART_JOB, Reason.RETRYABLE_FAILURE, ErrorSource.INSTANCE_EXIT), ["job.restarted"]),
    (decision(DecisionKind.RESTART_JOB, Reason.JOB_HANG, ErrorSource.HANG), ["hang.detected", "job.restarted"]),
    (decision(DecisionKind.RESTART_JOB, Reason.EXIT_HANG, ErrorSource.EXIT_HANG),
     ["exit_hang.detected", "job.restarted"]),
    (decision(DecisionKind.FAIL_JOB, Reason.RESTARTS_DISABLED, ErrorSource.HANG), ["hang.detected", "job.failed"]),
    (decision(DecisionKind.RESTART_INSTANCE, Reason.NODE_LOST, ErrorSource.NODE_LOST),
     ["node.lost", "instance.restarted"]),
    (decision(DecisionKind.RESTART_JOB, Reason.NODE_LOST, ErrorSource.NODE_LOST), ["node.lost", "job.restarted"]),
    (decision(DecisionKind.RESTART_INSTANCE, Reason.RETRYABLE_FAILURE, ErrorSource.INSTANCE_EXIT),
     ["instance.restarted"]),
    (decision(DecisionKind.FAIL_JOB, Reason.NON_RETRYABLE_FAILURE, ErrorSource.INSTANCE_EXIT), ["job.failed"]),
    (decision(DecisionKind.COMPLETE_JOB, Reason.ALL_INSTANCES_SUCCEEDED), ["job.succeeded"]),
    (decision(DecisionKind.ISOLATE_NODE, Reason.C4D_ERROR, ErrorSource.C4D), ["node.isolated"]),
    (decision(DecisionKind.RESTART_JOB, Reason.C4D_ERROR, ErrorSource.C4D), ["job.restarted"]),
    (decision(DecisionKind.REQUEUE, Reason.NODE_LOST, ErrorSource.PREEMPTION), ["job.requeued"]),
    (decision(DecisionKind.REQUEUE, Reason.NODE_LOST, ErrorSource.NODE_LOST), ["node.lost", "job.requeued"]),
    (decision(DecisionKind.NOTIFY, Reason.CUSTOM_MESSAGE, ErrorSource.SDK, error_message="loss is NaN"),
     ["custom.message"]),
    (decision(DecisionKind.NOTIFY, Reason.C4D_WARNING, ErrorSource.C4D), ["c4d.warning"]),
    (decision(DecisionKind.START_JOB, Reason.JOB_SUBMITTED), []),
]


@pytest.mark.parametrize("d,types", CASES, ids=lambda c: c.kind.value + "/" + (
    c.error_source.value if c.error_source else "-") if isinstance(c, Decision) else "")
def test_each_decision_becomes_its_events_observation_first(d, types):
    assert [e.type for e in events_from_decision(d, {})] == types


def test_event_ids_are_deterministic_per_decision_and_type():
    d = CASES[1][0]
    first, second = events_from_decision(d), events_from_decision(d)
    assert [e.id for e in first] == [e.id for e in second]
    assert first[0].id != first[1].id
    assert first[1].id == event_id(d.action_id, "job.restarted")
    other = msgspec.structs.replace(d, action_id="other")
    assert events_from_decision(other)[1].id != first[1].id


def test_a_hang_carries_the_stack_report_summary_and_the_restart_does_not():
    report = {"tool": "py-spy", "verdict": "rank 3 never entered allreduce", "suspects": ["worker-3"]}
    hang, restart = events_from_decision(CASES[1][0], {"stack_report": report, "framework": "pytorch"})
    assert hang.details == {"stack_report": report}
    assert restart.details is None
    assert hang.job == restart.job == {"framework": "pytorch"}


def test_details_and_job_context_are_bounded():
    context = {"details": {"blob": "x" * (MAX_DETAILS_BYTES + 1)}, "huge": "y" * 5000, "obj": object(),
               **{f"k{i:02d}": i for i in range(50)}}
    [event] = events_from_decision(CASES[0][0], context)
    assert event.details["truncated"] is True
    assert len(event.job["huge"]) == 1000 and "obj" not in event.job and len(event.job) == 32


def test_the_payload_is_a_versioned_standard_webhooks_payload():
    [event] = events_from_decision(CASES[13][0], {"framework": "pytorch"})
    payload = json.loads(json.dumps(event.payload()))
    assert set(payload) == {"type", "timestamp", "data"}
    assert payload["type"] == "custom.message"
    assert payload["timestamp"] == "2025-11-29T07:06:40.250Z"
    data = payload["data"]
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert data["event_id"] == event.id and data["job_id"] == "j1" and data["message"] == "loss is NaN"
    assert data["severity"] == "warning" and data["suppressed_count"] == 0 and data["suppressed_since"] is None
    assert event.payload(4, event.time - 30)["data"]["suppressed_since"] == "2025-11-29T07:06:10.250Z"


def test_every_type_has_a_severity_a_sample_and_a_summary():
    assert len(EVENT_TYPES) == 13
    for event_type in EVENT_TYPES:
        event = sample_event(event_type)
        assert event.type == event_type and event.summary.startswith("sample-job: ")
        assert event.details is not None and sample_event(event_type, with_details=False).details is None


def test_a_spot_job_preempted_and_resumed_becomes_requeued_resumed_succeeded_with_its_cost():
    job = SpotJob()
    job.at(0).market(offer(0.5))  # the bid is 0.6: it starts
    job.at(600).market(offer(0.9))  # preempted
    for name in ("worker-0", "worker-1"):
        job.exit(name, -9, round_=0, start=0)
    job.at(900).market(offer(0.4))  # resumed
    job.at(1500)
    for name in ("worker-0", "worker-1"):
        job.exit(name, 0)
    events = [e for d in job.decisions for e in events_from_decision(d)]
    assert [e.type for e in events] == ["job.requeued", "job.resumed", "job.succeeded"]
    requeued, resumed, succeeded = events
    assert requeued.error_source == "preemption" and requeued.reason == "preempted"
    assert requeued.details["cost"]["preemptions"] == 1 and resumed.details["cost"]["resumes"] == 1
    assert succeeded.details["cost"]["paid"] < succeeded.details["cost"]["on_demand"]
    assert "saved" in succeeded.summary and resumed.summary.startswith("spot-1: job resumed in round 1")


def test_a_crash_and_a_nan_message_in_a_real_engine_run_become_restarted_custom_message_succeeded():
    events = [e for d in crash_then_nan_decisions() for e in events_from_decision(d, {})]
    assert [e.type for e in events] == ["job.restarted", "custom.message", "job.succeeded"]
    assert events[1].message == "The training loss of the job is NaN."


def test_the_event_module_is_pure():
    path = pathlib.Path(__file__).resolve().parents[2] / "pipeline" / "trainwarden" / "notify" / "events.py"
    forbidden = {"time", "socket", "subprocess", "threading", "os", "asyncio", "trainwarden.runtime", "trainwarden.store",
                 "trainwarden.services", "trainwarden.cli", "trainwarden.bus", "trainwarden.notify.notifier",
                 "trainwarden.notify.transport", "trainwarden.notify.queue"}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            assert not any(name == f or name.startswith(f + ".") for f in forbidden), name
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("now", "utcnow", "today", "time_ns"), "reads a clock"
