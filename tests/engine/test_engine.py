"""The decision core: determinism, stale events, action ids, purity."""

import ast
import copy
import pathlib
import re

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


ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeline" / "trainwarden"
# The core's edge: the rule files are read here, and what they say is parsed by pure code.
RULE_FILE_LOADER = PACKAGE / "rules" / "loader.py"
# Reading or writing files: the builtin and a path's or a module's own calls, and the
# project's readers (a module that calls them reads through them).
FILE_MODULES = {"io", "os", "shutil", "tempfile", "glob", "fileinput", "mmap",
                "trainwarden.rules.loader", "trainwarden.jobspec", "trainwarden.spot.market"}
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob", "stat",
              "exists", "is_file", "is_dir", "load_yaml_file", "load_rules", "load_job_file"}


def core_modules() -> list[pathlib.Path]:
    return [*PACKAGE.joinpath("engine").glob("*.py"), *PACKAGE.joinpath("rules").glob("*.py"),
            *PACKAGE.joinpath("evidence").glob("*.py"), PACKAGE / "classify.py", PACKAGE / "attribution.py",
            PACKAGE / "settings.py", PACKAGE / "events.py", PACKAGE / "limits.py",
            PACKAGE / "supervision" / "intake.py",
            # the cluster on a virtual clock that rule tests and simulations drive
            PACKAGE / "simulation" / "cluster.py",
            # the pure parsers: hang-interval advice, C4D lines, stack dumps and their grouping
            *(PACKAGE / "diagnose" / name for name in ("advice.py", "c4d.py", "stacks.py", "report.py"))]


def documented_pure_modules() -> set[pathlib.Path]:
    """The modules that docs/DESIGN.md's module table calls pure."""
    modules = set()
    for row in (ROOT / "docs" / "DESIGN.md").read_text().splitlines():
        cells = [cell.strip() for cell in row.split("|")]
        if row.startswith("| `") and cells[-2].startswith("pure"):
            modules.update(PACKAGE / name for name in re.findall(r"`([\w/]+\.py)`", cells[1]))
    return modules


def _file_module(name: str) -> bool:
    return any(name == module or name.startswith(module + ".") for module in FILE_MODULES)


def file_access(path: pathlib.Path) -> list[str]:
    """Where a module reads or writes a file itself, or through a reader of the project."""
    tree = ast.parse(path.read_text())
    # An import for annotations alone never runs.
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for statement in node.body for inner in ast.walk(statement)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if _file_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            names = [*([node.module] if _file_module(node.module or "") else []),
                     *(alias.name for alias in node.names if alias.name in FILE_CALLS)]
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            names = [f"{called}()"] if called in FILE_CALLS else []
        else:
            continue
        found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}" for name in names]
    return found


def test_the_core_modules_import_no_io_and_read_no_clock():
    core = core_modules()
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


def test_the_pure_modules_read_no_file_and_loading_rule_files_stays_at_the_edge():
    documented = documented_pure_modules()
    assert all(path.is_file() for path in documented), sorted(str(p) for p in documented if not p.is_file())
    pure = (set(core_modules()) - {RULE_FILE_LOADER}) | documented
    assert len(pure) > 40
    assert [where for path in sorted(pure) for where in file_access(path)] == []
    # The check sees reading where there is some: the loader reads the rule files.
    assert file_access(RULE_FILE_LOADER)


def test_the_same_kill_at_different_points_counts_toward_the_same_error_limit():
    job = Job("--job-execution-mode=Async --fault-tolerant-policy=OnFailure --max-num-of-same-error=1 "
              "--max-num-of-job-restart=10")
    [first] = job.at(1).exit("worker-0", 137, "step 7 loss 0.3")
    job.feed(InstanceStarted(job_id="job-1", time=job.now, instance="worker-0", round=0, start=1))
    [second] = job.at(2).exit("worker-0", 137, "saving checkpoint 12")
    assert first.kind is DecisionKind.RESTART_INSTANCE
    assert second.kind is DecisionKind.FAIL_JOB and second.reason is Reason.SAME_ERROR_LIMIT_REACHED

