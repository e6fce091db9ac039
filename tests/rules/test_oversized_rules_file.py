"""A 50 MB rules file is refused from its size, before it is parsed, quickly,
in one error line instead of a hundred thousand; a file of a thousand wrong
entries reports the first twenty and counts the rest; a pack of more rules,
or a directory of more files, than any site writes is refused naming the
limit. `rules validate` (text and JSON) says the same."""

from __future__ import annotations

import json

from tests.refusal_cost import refusal_cost

WRONG_ENTRY = ("  - name: Bad_Name_{i}\n    category: user_code_error\n    retryable: maybe\n"
               "    patterns: ['Traceback \\\\(most recent call last\\\\)', 'Error: something went wrong']\n")


def _wrong_entries(path, *, count: int = 0, size: int = 0) -> None:
    path.parent.mkdir(exist_ok=True)
    with path.open("w") as out:
        out.write("version: 1\nclassifiers:\n")
        index = 0
        while index < count or out.tell() < size:
            out.write(WRONG_ENTRY.format(i=index))
            index += 1


def test_a_50_mb_rules_file_is_refused_before_parsing_quickly_in_one_line(tmp_path, cli):
    huge = tmp_path / "rules" / "90-huge.yaml"
    _wrong_entries(huge, size=50_000_000)
    cost = refusal_cost(f"load_rules({str(huge.parent)!r})", setup="from trainwarden.rules.loader import load_rules")
    assert cost.raised == "ConfigErrors", cost
    assert cost.message == f"{huge}: the file is 47.7 MiB; the rules may be at most 4 MiB a file", cost
    assert "docs/OPERATIONS.md (Input limits)" in cost.hint
    assert cost.cpu_s < 2.0 and cost.peak_mb < 100, cost

    result = cli("rules", "validate", str(huge))
    assert result.code == 2 and result.err.count("\n") == 2 and len(result.err) < 400, result


def test_a_thousand_wrong_entries_report_the_first_twenty_and_count_the_rest(tmp_path, cli):
    wrong = tmp_path / "rules" / "90-wrong.yaml"
    _wrong_entries(wrong, count=1000)
    result = cli("rules", "validate", str(wrong))
    assert result.code == 2, result
    lines = result.err.splitlines()
    assert len(lines) == 21, result  # 20 mistakes and the count of the others
    assert lines[0] == (f"trainwarden: error: {wrong}:3: rule name 'Bad_Name_0' must be lower-case letters, digits, "
                        "'_', '.', '-'")
    assert lines[20] == "... and 980 more errors"

    as_json = cli("rules", "validate", str(wrong), "-o", "json")
    report = json.loads(as_json.out)
    assert as_json.code == 2 and len(report["errors"]) == 20 and report["more_errors"] == 980, as_json


def _many_rules(directory, count: int):
    directory.mkdir()
    (directory / "10-many.yaml").write_text("version: 1\nclassifiers:\n" + "".join(
        f"  - {{name: rule-{i}, category: c, retryable: true, exit_codes: [{i % 200}]}}\n" for i in range(count)))
    return directory


def test_more_rules_than_a_pack_may_have_are_refused_naming_the_limit(tmp_path):
    rules = _many_rules(tmp_path / "rules", 2001)
    cost = refusal_cost(f"load_rules({str(rules)!r})", setup="from trainwarden.rules.loader import load_rules")
    assert cost.message == (f"{rules / '10-many.yaml'}:2: more than 2,000 rules by this section; the rules may have "
                            "at most 2,000 in all their files together"), cost
    # Bounded by what a pack at the limit costs to load, on this machine (an
    # absolute bound of 2 CPU-s held on one machine, not on another: 3.7 s).
    at_limit = refusal_cost(f"load_rules({str(_many_rules(tmp_path / 'limit', 2000))!r})",
                            setup="from trainwarden.rules.loader import load_rules")
    assert at_limit.raised == "", at_limit
    assert cost.cpu_s < 1.5 * at_limit.cpu_s + 0.5, (cost, at_limit)


def test_a_directory_of_more_rule_files_than_a_pack_may_have_is_refused_before_any_is_read(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    for index in range(501):
        (rules / f"{index:03}.yaml").write_text("version: 1\n")
    cost = refusal_cost(f"load_rules({str(rules)!r})", setup="from trainwarden.rules.loader import load_rules")
    assert cost.message == f"{rules}: 501 rule files in this directory; the rules may be at most 500 files", cost
