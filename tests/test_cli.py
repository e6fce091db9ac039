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
    assert verdict["retryable"] is True and verdict["category"] == "collective_timeout"
    assert verdict["rule"] == "nccl_watchdog_timeout" and verdict["exit_code"] == 134


def test_classify_reads_standard_input_and_takes_custom_keywords(cli):
    result = cli("classify", "--json", "--keyword", "error_yyy", "-", input="ValueError: error_yyy\n")
    assert json.loads(result.out)["rule"] == "sdk:custom_keyword"
    plain = cli("classify", "-", input="ModuleNotFoundError: No module named 'x'\n")
    assert plain.code == 0 and "not retryable" in plain.out and "missing_module" in plain.out


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
