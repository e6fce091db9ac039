"""An arguments string of a megabyte is refused from its length, before it is
split, quickly and with an error that quotes 80 characters of it, not the
megabyte; a flag's value too long for any number, and the longest --args a
command line carries, are flag mistakes, never an internal error."""

from __future__ import annotations

from tests.refusal_cost import refusal_cost

HUGE_ARGS = "'--job-hang-interval=' + 'x' * 1_000_000"


def test_a_1_mb_arguments_string_is_refused_quickly_quoting_only_its_beginning():
    cost = refusal_cost(f"parse_args_string(text)", setup=f"from trainwarden.settings import parse_args_string\n"
                                                          f"text = {HUGE_ARGS}")
    assert cost.raised == "SettingsError", cost
    assert cost.message == ("The arguments string is 1,000,020 characters long; it may be at most 4,096 (it begins "
                            "'--job-hang-interval=" + "x" * 60 + "'...)."), cost
    assert "docs/OPERATIONS.md (Input limits)" in cost.hint
    assert cost.cpu_s < 2.0 and cost.peak_mb < 100, cost


def test_a_job_file_whose_args_are_too_long_says_so_in_one_short_line(tmp_path, cli):
    job = tmp_path / "job.yaml"
    job.write_text("args: --job-hang-interval=" + "x" * 200_000 + "\nroles:\n  worker: {command: [python, t.py]}\n")
    result = cli("run", str(job))
    assert result.code == 2, result
    assert result.err.startswith(f"trainwarden: error: {job}:1: 'args': The arguments string is 200,020 characters "
                                 "long; it may be at most 4,096"), result
    assert len(result.err) < 500, result


def test_the_longest_args_a_command_line_carries_is_refused_as_a_flag_mistake(cli):
    result = cli("run", "--args", "--job-hang-interval=" + "1" * (128 * 1024 - 30), "--", "true")
    assert result.code == 2 and "internal error" not in result.err, result
    assert "The arguments string is 131,062 characters long" in result.err and len(result.err) < 500, result


def test_a_flag_value_longer_than_any_number_is_refused_quoting_its_beginning(cli):
    result = cli("run", "--args", "--job-hang-interval=" + "1" * 4000, "--", "true")
    assert result.code == 2, result
    assert ("--job-hang-interval must be an integer from 1 to 2592000, not '" + "1" * 80 + "'...") in result.err, \
        result
    assert len(result.err) < 500, result
