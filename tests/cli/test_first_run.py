"""What a newcomer meets first: help that lists the flags, outcomes that say
what to change, tables without trailing spaces, wording without slips."""

from __future__ import annotations

import sys

import msgspec
import pytest

from tests.builders import Job
from trainwarden.cli.main import build_parser
from trainwarden.cli.output import ConsoleReporter, plural
from trainwarden.diagnose.report import _suspects
from trainwarden.settings import defaults_table

RETRYABLE_CRASH = "import sys; print('RuntimeError: NCCL error: unhandled system error', file=sys.stderr); sys.exit(1)"


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return sub.format_help()


@pytest.mark.parametrize("command", ["run", "submit"])
def test_run_and_submit_help_list_every_flag_of_args_with_its_default(command):
    text = _help(command)
    for flag, default, _ in defaults_table():
        assert f"  {flag}={default}\n" in text, (command, flag)


def test_submit_help_says_where_the_command_runs():
    text = " ".join(_help("submit").split())
    assert "runs in the directory you submit from" in text and "workdir:" in text


def test_a_bare_trainwarden_shows_the_help_not_an_error(cli):
    result = cli()
    assert result.code == 0 and "usage: trainwarden" in result.out and "run" in result.out, result


def test_a_job_that_fails_with_restarts_off_names_the_flag_that_enables_them(cli, job_id):
    result = cli("run", "--job-id", job_id, "--", sys.executable, "-c", RETRYABLE_CRASH)
    assert result.code == 1, result
    assert f"job {job_id}: 1 instance, history in" in result.err, result
    assert f"job {job_id} failed (restarts_disabled); 0 job restarts." in result.err, result
    assert "add --enable-job-restart=True to --args" in result.err, result


def test_a_hang_that_ends_the_job_with_restarts_off_names_the_flag_too(cli, job_id):
    hang = "import time; print('step 1', flush=True); time.sleep(120)"
    result = cli("run", "--job-id", job_id, "--stack-tools", "none", "--args",
                 "--enable-job-hang-detection=True --job-hang-interval=2", "--", sys.executable, "-c", hang)
    assert result.code == 1, result
    assert "hang → fail_job" in result.err and "(restarts_disabled)" in result.err, result
    assert "add --enable-job-restart=True to --args" in result.err, result


def test_piped_tables_have_no_trailing_spaces(cli, job_id):
    cli("run", "--job-id", job_id, "--", sys.executable, "-c", RETRYABLE_CRASH)
    for view in (["history"], ["history", "--jobs"], ["history", "--aggregate"], ["runtimes"]):
        result = cli(*view)
        assert result.code == 0 and result.out.count("\n") >= 2, (view, result)
        assert all(line == line.rstrip() for line in result.out.splitlines()), (view, result.out)


def test_a_filter_that_matches_nothing_echoes_since_with_its_value(cli, job_id):
    cli("run", "--job-id", job_id, "--", sys.executable, "-c", RETRYABLE_CRASH)
    result = cli("history", "--since", "2000-01-01T00:00", "--node", "no-such-node")
    assert "no fault record matches --node no-such-node --since 2000-01-01T00:00" in result.out, result


def test_counts_are_singular_for_one():
    assert plural(1, "job restart") == "1 job restart" and plural(2, "job restart") == "2 job restarts"
    assert plural(1, "instance") == "1 instance" and plural(3, "process") == "3 processes"
    assert plural(2, "line", " cut at 16 KiB") == "2 lines cut at 16 KiB"


def test_a_decision_whose_classifier_is_named_as_its_category_says_it_once(capsys):
    job = Job("--enable-job-restart=True")
    job.at(1).exit("worker-1", 1, "ConnectionResetError: Connection reset by peer")
    job.at(30).tick()  # past the attribution window: a lost connection alone is judged by itself
    decision = next(d for d in job.decisions if d.classifier)
    assert decision.classifier == decision.category == "connection_lost"
    ConsoleReporter().decision(decision)
    printed = capsys.readouterr().err
    assert ", connection_lost →" in printed and "connection_lost by connection_lost" not in printed, printed
    other = msgspec.structs.replace(decision, classifier="nccl_error", category="collective_error")
    ConsoleReporter().decision(other)
    assert ", collective_error by nccl_error →" in capsys.readouterr().err


def test_a_stack_report_of_two_instances_stuck_together_says_both():
    _, verdict = _suspects({"worker-0": ("f",), "worker-1": ("f",)}, {})
    assert verdict.startswith("both instances are stuck at the same place, f")
    _, verdict = _suspects({"worker-0": ("f",), "worker-1": ("f",), "worker-2": ("f",)}, {})
    assert verdict.startswith("all 3 instances are stuck")
    suspects, verdict = _suspects({"worker-0": ("f",), "worker-1": ("g",), "worker-2": ("f",)}, {})
    assert suspects == ("worker-1",) and "while 2 others wait in f" in verdict


def test_the_actuator_history_and_report_read_one_store_setting(monkeypatch, tmp_path):
    from trainwarden.cli.stores import store_target
    from trainwarden.store import default_store_dir

    views = (["actuator"], ["history"], ["report", "-o", "x.html"], ["run", "--", "true"])
    monkeypatch.setenv("TRAINWARDEN_STORE", str(tmp_path / "shared"))
    assert {store_target(build_parser().parse_args(argv)) for argv in views} == {str(tmp_path / "shared")}
    monkeypatch.delenv("TRAINWARDEN_STORE")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the default: the user's own state directory
    assert {store_target(build_parser().parse_args(argv)) for argv in views} == {str(default_store_dir())}
    assert str(default_store_dir()).startswith(str(tmp_path / "state"))


def test_classify_on_a_clean_log_says_nothing_names_an_error_instead_of_unknown_unknown(cli, tmp_path):
    log = tmp_path / "worker-0.log"
    log.write_text("step 1: loss 0.3\nstep 2: loss 0.2\nall good\n")
    result = cli("classify", str(log))
    assert result.code == 0 and result.out.startswith("unknown: no line names an error, and exit code 1"), result
    assert "last error" not in result.out and "unknown: unknown" not in result.out, result
    assert "exit code 0 is a success" in cli("classify", str(log), "--exit-code", "0").out
