"""The same scenarios on every runtime, from one module: what a job does
must not depend on where it runs. Each scenario runs on each runtime of the
registry that this machine can host (``local``: ``trainwarden run``;
``agents``: node agents, processor and actuator on the in-process bus;
``slurm`` and ``kubernetes``: the same services, the agents on the nodes of
the local cluster CI starts, adopting the tasks or the pods' processes;
``pinned``: the runtime these
tests define, tests/scenarios/pinned.py), and
the history's fault rows must be the same on all of them -- node names aside,
and a decision the runtime cannot carry out (isolating a node on one machine)
recorded as ``unsupported`` there.
"""

from __future__ import annotations

import pytest

from tests.scenarios.runtimes import RUNTIMES, job, run
from trainwarden.events import Preempted
from trainwarden.clock import now as clock_now
from trainwarden.runtime.base import Capability
from trainwarden.runtime import registry
from trainwarden.runtime.registry import runtime_kind
from tests.scenarios.pinned import KIND as PINNED, PinnedSite

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
# A retryable fault no machine causes: the same one on one node twice in a
# row does not isolate it (engine/operational.py), on one node or several.
STALE_HANDLE = "OSError: [Errno 116] Stale file handle"
C4D_ERROR = '[C4D] level=Error kind=RankCommHang rank=0 detail="allreduce stuck for 190 s"'

# scenario -> runtime -> rows, to hold every runtime to the first one's rows
_ROWS: dict[str, dict[str, list]] = {}


@pytest.fixture(params=RUNTIMES)
def runtime(request, job_id):
    if request.param != PINNED.name:
        yield request.param
        return
    # The tests' own runtime plugs in by its registry entry alone.
    registry.register(PINNED)
    try:
        yield request.param
    finally:
        registry.unregister(PINNED.name)
    assert job_id in PinnedSite.built, "the job did not run on the tests' own runtime"


def _same_rows_everywhere(scenario: str, runtime: str, rows: list) -> None:
    capabilities = runtime_kind(runtime).capabilities

    def portable(row):
        # Where a runtime lacks the capability, its row says so; the rest must match.
        return tuple("done|unsupported" if row[1] == "isolate_node" and i == 3 else v for i, v in enumerate(row))

    seen = _ROWS.setdefault(scenario, {})
    for other, other_rows in seen.items():
        assert [portable(r) for r in rows] == [portable(r) for r in other_rows], (
            f"{scenario}: {runtime} wrote other rows than {other}")
    seen[runtime] = rows
    for row in rows:
        if row[1] == "isolate_node":
            assert row[3] == ("done" if Capability.ISOLATE_NODE in capabilities else "unsupported"), row


def _field(text: str, name: str) -> str:
    return next(word.split("=", 1)[1] for word in text.split() if word.startswith(name + "="))


def _done(outcome, action=None):
    return [r for r in outcome.faults if r["result"] != "pending" and (action is None or r["action"] == action)]


def test_a_retryable_crash_restarts_the_job_and_every_instance_resumes_from_its_checkpoint(runtime, tmp_path,
                                                                                           job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-restart=True", "--fail-rank", "1",
                                         "--fail-at-step", "2", "--fail-message", NCCL, "--steps", "5"))
    assert outcome.succeeded, outcome.texts()
    [restart] = _done(outcome)
    assert (restart["action"], restart["error_source"], restart["result"]) == ("restart_job", "instance_exit", "done")
    # The restarted incarnations were told to resume, where the checkpoints are, and picked them up.
    assert any(t.startswith("resuming worker-1 round=1 at step 2 resume=1") for t in outcome.texts("worker-1", 1))
    [worker0] = [t for t in outcome.texts("worker-0", 1) if t.startswith("resuming")]
    assert " at step 0 " not in worker0 and "resume=1" in worker0, worker0
    assert [t for t in outcome.texts(round_=0) if t.startswith("starting")] and all(
        "resume=0" in t for t in outcome.texts(round_=0) if t.startswith("starting"))
    [record] = outcome.jobs
    assert record["status"] == "succeeded" and record["rounds"] == 1
    if runtime == "kubernetes":  # restarted in place: each pod's host ran both rounds, no pod was recreated
        assert sorted([stem.split("s")[0] for stem in stems] for stems in outcome.engine["pods"].values()) == [
            ["r0", "r1"]] * 2, outcome.engine
    _same_rows_everywhere("retryable crash", runtime, outcome.rows())


def test_in_an_async_job_a_retryable_crash_of_one_worker_restarts_that_worker_alone_while_the_others_keep_running(
        runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--job-execution-mode=Async --enable-job-restart=True",
                                         "--fail-rank", "1", "--fail-start", "0", "--fail-at-step", "2",
                                         "--fail-message", NCCL, "--steps", "60", "--step-s", "0.25", nproc=3),
                  timeout_s=120)
    assert outcome.succeeded, outcome.texts()
    [restart] = _done(outcome)
    assert (restart["action"], restart["instance_name"], restart["error_source"], restart["round"]) == (
        "restart_instance", "worker-1", "instance_exit", 0), restart
    # The others ran their one incarnation from start to end, through worker-1's restart.
    [resumed] = [line for line in outcome.lines if line.instance == "worker-1" and line.text.startswith("resuming")]
    assert (resumed.round, resumed.start) == (0, 1) and resumed.text.startswith(
        "resuming worker-1 round=0 at step 2 resume=1 rank=1 world=3 "), resumed
    # Its rank, world and master are the round's, not those of a job of one.
    [first] = [t for t in outcome.texts("worker-1") if t.startswith("starting")]
    assert _field(resumed.text, "master") == _field(first, "master"), (first, resumed.text)
    for name in ("worker-0", "worker-2"):
        lines = [line for line in outcome.lines if line.instance == name]
        assert {(line.round, line.start) for line in lines} == {(0, 0)}, name
        assert [line.text for line in lines if line.text.startswith(("starting", "resuming"))] == [
            line.text for line in lines[:1]] and lines[0].text.startswith(f"starting {name} round=0 at step 0")
        assert lines[-1].text == f"done {name}" and lines[-1].time > resumed.time, (name, lines[-1])
    assert outcome.texts("worker-1")[-1] == "done worker-1"
    [record] = outcome.jobs
    assert record["status"] == "succeeded" and record["rounds"] == 0, record
    _same_rows_everywhere("async crash", runtime, outcome.rows())


def test_a_hang_is_restarted_with_a_stack_report_and_the_lines_printed_while_stopping_are_kept(runtime, tmp_path,
                                                                                              job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=3",
                                         "--hang-round", "0", "--hang-at-step", "2", "--steps", "4"))
    assert outcome.succeeded, outcome.texts()
    [restart] = _done(outcome)
    assert (restart["action"], restart["error_source"]) == ("restart_job", "hang")
    [report] = outcome.stacks
    assert report["round"] == 0 and report["processes"] == 2 and report["missing"] == "", report
    # Each hung worker says on SIGTERM what its checkpoint holds: that line reaches the user...
    for name in ("worker-0", "worker-1"):
        assert f"sigterm: {name} stops; its checkpoint holds step 1" in outcome.texts(name, 0), outcome.texts(name, 0)
        assert any(t.startswith(f"resuming {name} round=1 at step 2") for t in outcome.texts(name, 1))
    # ... and the files the runtime keeps of each incarnation.
    if runtime != "local":
        kept = "".join(p.read_text() for p in outcome.log_files if "/r0-" in str(p))
        assert "sigterm: worker-0 stops" in kept and "sigterm: worker-1 stops" in kept
    _same_rows_everywhere("hang", runtime, outcome.rows())


def test_a_c4d_error_on_the_diagnostic_channel_isolates_the_node_and_restarts_the_job(runtime, tmp_path, job_id):
    def c4d_when_worker0_is_at_step_2(line):
        return C4D_ERROR if line.instance == "worker-0" and line.round == 0 and line.text == "step 2" else None

    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-hang-detection=True --enable-c4d-hang-detection=True "
                                         "--enable-job-restart=True", "--steps", "12", "--step-s", "0.25"),
                  trigger=c4d_when_worker0_is_at_step_2)
    assert outcome.succeeded, outcome.texts()
    done = _done(outcome)
    assert sorted((r["action"], r["error_source"]) for r in done) == [("isolate_node", "c4d"), ("restart_job", "c4d")]
    [isolated] = [r["node_name"] for r in done if r["action"] == "isolate_node"]
    [finding] = outcome.diagnoses
    assert finding["trusted"] and finding["kind"] == "RankCommHang" and finding["node_name"] == isolated
    if Capability.ISOLATE_NODE in runtime_kind(runtime).capabilities:
        # The next round avoids the isolated node.
        round1 = [t for t in outcome.texts(round_=1) if t.startswith("resuming")]
        assert len(round1) == 2 and all(f"node={isolated}" not in t for t in round1), round1
    if runtime == "kubernetes":  # cordoned and tainted; an operator's `nodes uncordon` returned it
        assert outcome.engine["isolated"] == outcome.engine["uncordoned"] == [isolated], outcome.engine
    _same_rows_everywhere("c4d error", runtime, outcome.rows())


def test_a_preemption_restarts_the_job_and_counts_as_one_job_restart_in_the_jobs_table_on_every_runtime(
        runtime, tmp_path, job_id):
    def preempted_when_worker0_is_at_step_2(line):
        if line.instance == "worker-0" and line.round == 0 and line.text == "step 2":
            return Preempted(job_id=job_id, time=clock_now(), round=0, reason="the scheduler took the nodes back")
        return None

    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-restart=True", "--steps", "8",
                                         "--step-s", "0.2"), trigger=preempted_when_worker0_is_at_step_2)
    assert outcome.succeeded, outcome.texts()
    [restart] = _done(outcome)
    assert (restart["action"], restart["reason"], restart["error_source"]) == (
        "restart_job", "preempted", "preemption"), restart
    assert any(t.startswith("resuming worker-0 round=1") for t in outcome.texts("worker-0", 1))
    if runtime == "kubernetes":  # a real eviction, seen by the runtime as Kubernetes said it
        assert "evicted through the Eviction API" in restart["error_message"], restart
    # No limit counts a preemption, but the job was restarted once: the jobs table says so everywhere.
    [record] = outcome.jobs
    assert (record["status"], record["rounds"]) == ("succeeded", 1), record
    _same_rows_everywhere("preemption", runtime, outcome.rows())


def test_a_c4d_line_the_job_prints_itself_is_recorded_and_decides_nothing(runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-hang-detection=True --enable-c4d-hang-detection=True "
                                         "--enable-job-restart=True", "--steps", "3", "--say", C4D_ERROR))
    assert outcome.succeeded, outcome.texts()
    assert _done(outcome) == []
    [finding] = outcome.diagnoses
    assert not finding["trusted"] and finding["action"].startswith("recorded only: printed by worker-0"), finding
    _same_rows_everywhere("untrusted c4d", runtime, outcome.rows())


def test_a_job_that_reports_progress_through_the_sdk_is_restarted_after_every_round_that_got_further(
        runtime, tmp_path, job_id):
    # Not one restart without progress is allowed; rank 0's reports make each one progress.
    outcome = run(runtime, tmp_path, job(job_id, tmp_path,
                                         "--enable-job-restart=True --max-num-of-no-progress-restart=0",
                                         "--report-progress", "--fail-rank", "1", "--fail-at-step", "2",
                                         "--fail-rounds", "2", "--fail-message", STALE_HANDLE, "--steps", "40",
                                         "--step-s", "0.05"))
    assert outcome.succeeded, [(r["round"], r["action"], r["reason"], r["error_message"]) for r in outcome.faults]
    assert [(r["action"], r["reason"]) for r in _done(outcome)] == [("restart_job", "retryable_failure")] * 2
    refused = [(line.instance, line.round, line.text) for line in outcome.lines
               if line.text.startswith("report_progress:")]
    assert not refused, refused
    _same_rows_everywhere("progress reported", runtime, outcome.rows())


def test_a_crash_loop_that_reports_no_progress_ends_at_the_no_progress_limit(runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path,
                                         "--enable-job-restart=True --max-num-of-no-progress-restart=0",
                                         "--fail-rank", "1", "--fail-at-step", "2", "--fail-message", NCCL))
    assert not outcome.succeeded
    [record] = _done(outcome)
    assert (record["action"], record["reason"], record["instance_name"]) == ("fail_job", "no_progress", "worker-1")
    _same_rows_everywhere("no progress", runtime, outcome.rows())


def test_a_keyword_set_through_the_sdk_makes_a_user_error_retryable(runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-restart=True", "--keyword",
                                         "CUSTOM-FLAKE-42", "--fail-rank", "1", "--fail-at-step", "1",
                                         "--fail-message", "ValueError: the batch had CUSTOM-FLAKE-42 in it"))
    assert outcome.succeeded, outcome.texts()
    [restart] = _done(outcome)
    assert (restart["action"], restart["category"]) == ("restart_job", "custom_keyword"), restart
    _same_rows_everywhere("sdk keyword", runtime, outcome.rows())


def test_a_nan_message_through_the_sdk_is_recorded_as_a_notification(runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "", "--message", "The training loss of the job is NaN.",
                                         "--steps", "3"))
    assert outcome.succeeded, outcome.texts()
    [record] = _done(outcome)
    assert record["action"] == "notify" and record["error_message"] == "The training loss of the job is NaN."
    _same_rows_everywhere("nan message", runtime, outcome.rows())


def test_an_sdk_request_from_a_process_outside_every_instance_is_refused_and_kept_as_a_dead_letter(
        runtime, tmp_path, job_id):
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "", "--forge", "--steps", "3"))
    assert outcome.succeeded, outcome.texts()
    [said] = [t for t in outcome.texts("worker-0") if t.startswith("forged: ")]
    assert '"ok":false' in said.replace(" ", ""), said
    assert _done(outcome) == []  # nothing was decided on it
    [letter] = [d for d in outcome.dead_letters if "sdk" in d["source"]]
    assert "is not a process of any running incarnation" in letter["error"], letter


def test_an_engine_error_fails_the_job_saying_so_and_keeps_the_event(runtime, tmp_path, job_id, monkeypatch):
    from trainwarden.events import InstanceExited
    from trainwarden.supervision import intake

    real_step = intake.step

    def broken_step(state, event, now):
        if isinstance(event, InstanceExited):
            raise RuntimeError("simulated engine bug")
        return real_step(state, event, now)

    # The one intake every runtime steps the engine through (in this process: run, or the processor).
    monkeypatch.setattr(intake, "step", broken_step)
    outcome = run(runtime, tmp_path, job(job_id, tmp_path, "--enable-job-restart=True", "--fail-rank", "1",
                                         "--fail-at-step", "1", "--fail-message", NCCL, "--steps", "30"))
    assert outcome.final is not None and outcome.final.reason.value == "engine_error", outcome.final
    [record] = _done(outcome)
    assert (record["action"], record["reason"]) == ("fail_job", "engine_error")
    # Every event the engine could not take is kept (on a cluster the other
    # instance's exit after the stop meets the same bug, and is kept too).
    letters = [d for d in outcome.dead_letters if d["source"].endswith("engine")]
    assert letters and all("simulated engine bug" in d["error"] and "InstanceExited" in d["payload"]
                           for d in letters), letters
    [job_row] = outcome.jobs
    assert job_row["status"] == "failed" and job_row["reason"] == "engine_error"
    _same_rows_everywhere("engine error", runtime, outcome.rows())
