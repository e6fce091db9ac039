"""A job file far larger than any job needs (100,000 roles: 5 MB) is refused
from its size, before it is parsed, in bounded time and memory, with one
sentence naming the file and the limit; one under the byte limit but full of
values stops at its value limit, naming the line; a number too long for
Python to convert is a mistake at its line, not an internal error."""

from __future__ import annotations

from tests.refusal_cost import refusal_cost


def _roles(path, count: int) -> None:
    with path.open("w") as out:
        out.write("roles:\n")
        for index in range(count):
            out.write(f"  worker-{index}: {{count: 1, command: [python, train.py]}}\n")


def test_a_job_file_of_100000_roles_is_refused_before_parsing_in_bounded_time_and_memory(tmp_path, cli):
    job = tmp_path / "roles.yaml"
    _roles(job, 100_000)
    cost = refusal_cost(f"load_job_file({str(job)!r})", setup="from trainwarden.jobspec import load_job_file")
    assert cost.raised == "OverLimit", cost
    assert cost.message == f"{job}: the file is 5.3 MiB; a job file may be at most 256 KiB", cost
    assert "docs/OPERATIONS.md (Input limits)" in cost.hint
    assert cost.cpu_s < 2.0 and cost.peak_mb < 100, cost

    result = cli("run", str(job))
    assert result.code == 2, result
    assert result.err.count("\n") == 2 and len(result.err) < 400, result  # the sentence and its hint


def test_a_job_file_under_the_byte_limit_but_full_of_roles_stops_at_its_value_limit(tmp_path):
    job = tmp_path / "dense.yaml"
    _roles(job, 4_500)  # 240 KiB, 36,000 values
    cost = refusal_cost(f"load_job_file({str(job)!r})", setup="from trainwarden.jobspec import load_job_file")
    assert cost.raised == "OverLimit", cost
    assert cost.message.startswith(f"{job}:1251: more than 10,000 values (mappings, lists, scalars) by this line; "
                                   "a job file may hold at most 10,000"), cost
    assert cost.cpu_s < 2.0 and cost.peak_mb < 100, cost


def test_roles_that_come_to_more_instances_than_a_job_may_have_are_refused(tmp_path):
    job = tmp_path / "wide.yaml"
    job.write_text("roles:\n  chief: {count: 1, command: [python, t.py]}\n"
                   "  worker: {count: 16384, command: [python, t.py]}\n")
    cost = refusal_cost(f"load_job_file({str(job)!r})", setup="from trainwarden.jobspec import load_job_file")
    assert cost.message == f"{job}:3: the roles come to more than 16384 instances; a job may have at most 16384", cost


def test_a_number_too_long_to_convert_is_a_mistake_at_its_line(tmp_path, cli):
    job = tmp_path / "long-number.yaml"
    job.write_text("stop_grace_s: " + "1" * 5000 + "\nroles:\n  worker: {command: [python, t.py]}\n")
    result = cli("run", str(job))
    assert result.code == 2, result
    assert f"{job}:1: invalid YAML: the number '11111111111111111111'... has 5,000 characters" in result.err, result
    assert "internal error" not in result.err and len(result.err) < 400, result
