"""The decision core: determinism, stale events, action ids, purity."""

import ast
import copy
import pathlib

from trainwarden.events import DecisionKind, ErrorSource, InstanceStarted, Reason, SdkOp
from tests.builders import Job

RESTARTS = "--enable-job-restart=True"


def test_the_same_events_replayed_give_the_same_decisions_and_action_ids():
    def play():
        job = Job(RESTARTS)
        job.at(1).exit("worker-1", 1, "RuntimeError: NCCL error")
        job.restart_all()
        job.at(2).sdk("worker-0", SdkOp.CUSTOM_MESSAGE, content="NaN")
        job.at(3).exit("worker-0", 137)
        return [(d.kind, d.reason, d.action_id) for d in job.decisions]

    first, second = play(), play()
    assert first == second and len(first) == 3
    assert len({a for _, _, a in first}) == 3


def test_action_ids_differ_between_jobs():
    a, b = Job(RESTARTS, job_id="a"), Job(RESTARTS, job_id="b")
    [da], [db] = a.at(1).exit("worker-0", 137), b.at(1).exit("worker-0", 137)
    assert da.action_id != db.action_id


def test_exits_of_a_stopped_round_are_stale_and_ignored():
    job = Job(RESTARTS)
    [restart] = job.at(1).exit("worker-0", 137)
    assert restart.kind is DecisionKind.RESTART_JOB and job.state.round == 1
    # worker-1 of round 0 dies as the actuator stops it: not a new fault.
    from trainwarden.events import InstanceExited
    assert job.feed(InstanceExited(job_id="job-1", time=job.now, instance="worker-1", round=0, start=0,
                                   exit_code=143)) == []
    assert job.state.stale_events == 1


def test_a_failure_decision_carries_code_message_source_and_category():
    job = Job(RESTARTS)
    [d] = job.at(4).exit("worker-1", 1, "Traceback (most recent call last):",
                         "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275")
    assert d.error_source is ErrorSource.INSTANCE_EXIT and d.error_code == 1 and d.instance == "worker-1"
    assert d.category == "collective_error" and d.classifier == "nccl_error"
    assert "NCCL error" in d.error_message and d.rule == "sync_retryable_failure"


def test_a_custom_message_from_a_stale_incarnation_is_still_delivered():
    job = Job(RESTARTS)
    job.at(1).exit("worker-0", 137)
    from trainwarden.events import SdkMessage
    [d] = job.feed(SdkMessage(job_id="job-1", time=job.now, instance="worker-1", round=0, start=0,
                              op=SdkOp.CUSTOM_MESSAGE, content="late NaN"))
    assert d.kind is DecisionKind.NOTIFY and d.reason is Reason.CUSTOM_MESSAGE


def test_a_finished_job_takes_no_more_decisions():
    job = Job("--fault-tolerant-policy=Never")
    job.at(1).exit("worker-0", 1)
    assert job.state.finished
    assert job.at(2).exit("worker-1", 1) == [] and job.at(3).tick() == []


def test_step_does_not_change_a_snapshot_taken_before_it():
    job = Job(RESTARTS)
    snapshot = copy.deepcopy(job.state)
    job.at(1).exit("worker-0", 137)
    assert snapshot.round == 0 and job.state.round == 1


def test_the_core_modules_import_no_io_and_read_no_clock():
    root = pathlib.Path(__file__).resolve().parents[2] / "pipeline" / "trainwarden"
    core = [*root.joinpath("engine").glob("*.py"), *root.joinpath("rules").glob("*.py"),
            *root.joinpath("evidence").glob("*.py"), root / "classify.py", root / "attribution.py",
            root / "settings.py", root / "events.py", root / "limits.py", root / "supervision" / "intake.py",
            # the pure parsers: hang-interval advice, C4D lines, stack dumps and their grouping
            *(root / "diagnose" / name for name in ("advice.py", "c4d.py", "stacks.py", "report.py"))]
    assert len(core) > 25
    forbidden = {"time", "datetime", "socket", "subprocess", "threading", "os", "selectors", "asyncio",
                 "trainwarden.runtime", "trainwarden.services", "trainwarden.cli", "trainwarden.bus",
                 "trainwarden.notify", "trainwarden.actuator", "trainwarden.diagnose.collect",
                 "trainwarden.supervision.acting", "trainwarden.supervision.stack_reports",
                 # the store's rows are plain data; its backends are not
                 *(f"trainwarden.store.{m}" for m in ("embedded", "server", "spool", "ingest", "locking",
                                                      "migrate", "base", "queries", "schema"))}
    for path in core:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not any(name == f or name.startswith(f + ".") for f in forbidden), f"{path.name}: {name}"


def test_the_same_kill_at_different_points_counts_toward_the_same_error_limit():
    job = Job("--job-execution-mode=Async --fault-tolerant-policy=OnFailure --max-num-of-same-error=1 "
              "--max-num-of-job-restart=10")
    [first] = job.at(1).exit("worker-0", 137, "step 7 loss 0.3")
    job.feed(InstanceStarted(job_id="job-1", time=job.now, instance="worker-0", round=0, start=1))
    [second] = job.at(2).exit("worker-0", 137, "saving checkpoint 12")
    assert first.kind is DecisionKind.RESTART_INSTANCE
    assert second.kind is DecisionKind.FAIL_JOB and second.reason is Reason.SAME_ERROR_LIMIT_REACHED

