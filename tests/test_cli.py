"""The CLI's stable interface: classify, rules validate/test, history output."""

import json
import sys

from trainwarden.store import open_writer
from trainwarden.store.records import FAULT_FIELDS, FaultRecord


def test_classify_prints_the_verdict_as_json(cli, tmp_path):
    log = tmp_path / "worker-3.log"
    log.write_text("step 7\n[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2143, "
                   "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600535 milliseconds before timing out.\n")
    result = cli("classify", "--exit-code", "134", "--json", str(log))
    assert result.code == 0, result
    verdict = json.loads(result.out)
    assert verdict["retryable"] is True and verdict["verdict"] == "retryable"
    assert verdict["category"] == "collective_timeout"
    assert verdict["rule"] == "nccl_watchdog_timeout" and verdict["exit_code"] == 134


def test_classify_reads_standard_input_and_takes_custom_keywords(cli):
    result = cli("classify", "--json", "--keyword", "error_yyy", "-", input="ValueError: error_yyy\n")
    assert json.loads(result.out)["rule"] == "sdk:custom_keyword"
    plain = cli("classify", "-", input="ModuleNotFoundError: No module named 'x'\n")
    assert plain.code == 0 and "not retryable" in plain.out and "missing_module" in plain.out


GLOO_CLOSED = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
               "Connection closed by peer [127.0.0.1]:40123\n")
SHAPE_ERROR = ("Traceback (most recent call last):\n  File \"/job/train.py\", line 40, in <module>\n"
               "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x16 and 32x4)\n")


def test_classify_takes_the_negative_exit_code_torchelastic_reports_for_a_signal(cli, tmp_path):
    log = tmp_path / "worker-0.log"
    log.write_text("step 12 loss 0.31\n")
    minus, plus = (json.loads(cli("classify", "--json", f"--exit-code={code}", str(log)).out) for code in (-9, 137))
    assert minus["verdict"] == plus["verdict"] == "retryable"
    assert minus["rule"] == plus["rule"] == "killed_by_platform" and minus["exit_code"] == -9


def test_classify_judges_several_instances_as_one_failure_with_the_root_cause_deciding(cli, tmp_path):
    (tmp_path / "worker-0.log").write_text(GLOO_CLOSED)
    (tmp_path / "worker-1.log").write_text(SHAPE_ERROR)
    (tmp_path / "worker-2.log").write_text(GLOO_CLOSED)
    result = cli("classify", "--json", *(str(tmp_path / f"worker-{i}.log") for i in range(3)))
    assert result.code == 0, result
    judged = json.loads(result.out)
    assert judged["verdict"] == "not_retryable" and judged["category"] == "user_shape_error"
    assert judged["root_cause"]["instance"] == "worker-1"
    assert [(c["instance"], c["consequence"]) for c in judged["consequences"]] == [
        ("worker-0", True), ("worker-2", True)]
    # A directory is its files.
    assert json.loads(cli("classify", "--json", str(tmp_path)).out)["root_cause"]["instance"] == "worker-1"


def test_classify_explain_shows_the_evidence_weighed_and_why_the_root_won(cli, tmp_path):
    (tmp_path / "worker-0.log").write_text(GLOO_CLOSED)
    (tmp_path / "worker-1.log").write_text(SHAPE_ERROR)
    result = cli("classify", "--explain", str(tmp_path / "worker-0.log"), str(tmp_path / "worker-1.log"))
    assert result.code == 0, result
    assert "root cause: worker-1 (exit code 1; first own error)" in result.out
    assert "consequence: worker-0: connection_lost (peer_closed_connection)" in result.out
    assert "shape_error [own, priority 58]" in result.out and "peer_closed_connection [aftermath" in result.out
    assert "raised in user" in result.out


KEY_ERROR = ("Traceback (most recent call last):\n  File \"/job/train.py\", line 40, in training_step\n"
             "KeyError: 'input_ids'\n")


def test_classify_explain_says_how_progress_recurrence_and_the_node_would_weigh_in_a_running_job(cli, tmp_path):
    (tmp_path / "worker-0.log").write_text(KEY_ERROR)
    result = cli("classify", "--explain", str(tmp_path / "worker-0.log"))
    assert result.code == 0, result
    assert "phase the lines show: training" in result.out
    assert "before any progress in its round: fail_job (non_retryable_failure" in result.out
    assert "after progress, the first time: restart_job (second_chance, rule first_error_after_progress)" in result.out
    assert "the same again at the same step: fail_job" in result.out
    judged = json.loads(cli("classify", "--explain", "--json", str(tmp_path / "worker-0.log")).out)
    operational = judged["operational"]
    assert operational["phase"] == "training"
    [after] = operational["situations"]["after_progress"]
    assert after["reason"] == "second_chance" and "progress: step 100" in after["evidence"]
    assert "operational" not in json.loads(cli("classify", "--json", str(tmp_path / "worker-0.log")).out)


def test_classify_refuses_exit_codes_that_do_not_fit_the_files(cli, tmp_path):
    (tmp_path / "a.log").write_text("x\n")
    (tmp_path / "b.log").write_text("y\n")
    result = cli("classify", "--exit-code", "1", "--exit-code", "2", "--exit-code", "3",
                 str(tmp_path / "a.log"), str(tmp_path / "b.log"))
    assert result.code == 2 and "3 --exit-code values for 2 files" in result.err
    assert cli("classify", "--exit-code", "300", "-", input="x").code == 2


def test_classify_of_a_missing_file_is_a_clear_usage_error(cli):
    result = cli("classify", "/nonexistent/log")
    assert result.code == 2 and "cannot read the log" in result.err and "Traceback" not in result.err


def test_rules_validate_lists_the_shipped_rules(cli):
    result = cli("rules", "validate", "--json")
    assert result.code == 0, result
    names = {r["name"] for r in json.loads(result.out)["rules"]}
    assert {"job_hang", "nccl_watchdog_timeout", "sync_retryable_failure", "job_restart_limit"} <= names


def test_rules_validate_names_the_file_and_line_of_a_mistake(cli, tmp_path):
    (tmp_path / "x.yaml").write_text("version: 1\nclassifiers:\n  - name: a\n    category: b\n    retryable: maybe\n"
                                     "    patterns: ['x']\n")
    result = cli("rules", "validate", str(tmp_path))
    assert result.code == 2 and f"{tmp_path / 'x.yaml'}:5" in result.err


def test_rules_test_passes_on_the_shipped_tests_and_fails_on_a_wrong_one(cli, tmp_path):
    assert cli("rules", "test", "rules/tests").code == 0
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("tests:\n  - name: expects a restart that never comes\n    args: ''\n"
                     "    expect:\n      - {at: 1, action: restart_job}\n")
    result = cli("rules", "test", "--rules", "rules", str(wrong))
    assert result.code == 1 and "FAIL" in result.out


def _record(job: str, record_id: str, t: float, instance: str, message: str) -> FaultRecord:
    return FaultRecord(record_id=record_id, job_id=job, time=t, round=0, node_name="n1", instance_name=instance,
                       error_code=1, error_message=message, error_source="instance_exit", action="restart_job",
                       result="done", duration_s=1.5, reason="retryable_failure", rule="sync_retryable_failure",
                       classifier="nccl_error", category="collective_error", error_signature="1:nccl_error",
                       updated_at=t + 1)


def test_history_json_has_exactly_the_documented_fields(cli, store):
    open_writer(store).write([_record("j1", "a", 1_800_000_000.0, "worker-0", "NCCL error 1")])
    rows = json.loads(cli("history", "--json").out)
    assert len(rows) == 1 and tuple(rows[0]) == FAULT_FIELDS
    assert rows[0]["duration_s"] == 1.5 and rows[0]["time"] == 1_800_000_000.0


def test_history_aggregate_groups_same_errors_with_counts_and_first_and_last_time(cli, store):
    open_writer(store).write([
        _record("j1", "a", 1_800_000_000.0, "worker-0", "NCCL error at 1"),
        _record("j1", "b", 1_800_000_100.0, "worker-0", "NCCL error at 2"),
        _record("j1", "c", 1_800_000_050.0, "worker-1", "NCCL error at 3"),
        _record("j2", "d", 1_800_000_060.0, "worker-0", "NCCL error at 4"),
    ])
    groups = json.loads(cli("history", "--aggregate", "--job", "j1", "--json").out)
    by_instance = {g["instance_name"]: g for g in groups}
    assert by_instance["worker-0"]["count"] == 2 and by_instance["worker-1"]["count"] == 1
    assert by_instance["worker-0"]["first_time"] == 1_800_000_000.0
    assert by_instance["worker-0"]["last_time"] == 1_800_000_100.0


def test_an_unknown_subcommand_is_a_usage_error(cli):
    result = cli("frobnicate")
    assert result.code == 2 and "Traceback" not in result.err


def test_the_console_script_is_installed_next_to_the_interpreter():
    import pathlib
    script = pathlib.Path(sys.executable).parent / "trainwarden"
    assert script.exists()


GLOO_TEXT = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
             "[bold]x[/bold] [/red]")
NCCL_TEXT = "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout"


def test_history_shows_gloo_and_nccl_error_texts_unchanged_in_every_view(cli, store):
    # Job text is data: "[/pytorch/...]" is not a Rich closing tag, "[bold]" is not a style.
    open_writer(store).write([_record("j1", "a", 1_800_000_000.0, "worker-0", GLOO_TEXT),
                              _record("j1", "b", 1_800_000_001.0, "worker-1", NCCL_TEXT)])
    for view in ((), ("--wide",), ("--aggregate",), ("--jobs",), ("--stages",)):
        result = cli("history", *view, env={"COLUMNS": "400"})
        assert result.code == 0 and "Traceback" not in result.err and "MarkupError" not in result.err, (view, result)
    plain = cli("history").out
    assert "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection" in plain
    assert "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3]" in plain
    assert [r["error_message"] for r in json.loads(cli("history", "--json").out)] == [GLOO_TEXT, NCCL_TEXT]


def test_the_report_shows_gloo_and_nccl_error_texts_unchanged(cli, store, tmp_path):
    import html

    from tests.store.store_factories import job

    open_writer(store).write([job("j1", 1_799_999_990.0),
                              _record("j1", "a", 1_800_000_000.0, "worker-0", GLOO_TEXT + " <b>x</b>"),
                              _record("j1", "b", 1_800_000_001.0, "worker-1", NCCL_TEXT)])
    page = tmp_path / "report.html"
    result = cli("report", "--job", "j1", "-o", str(page))
    assert result.code == 0, result
    text = page.read_text()
    assert html.escape(GLOO_TEXT + " <b>x</b>", quote=False) in text and "<b>x</b>" not in text
    assert html.escape(NCCL_TEXT, quote=False) in text
