"""`rules validate PATH...` takes files as promtool does, and reports every mistake of a file at once."""

import json

from trainwarden.rules.loader import load_rules
from trainwarden.yamlsrc import ConfigErrors

THREE_MISTAKES = """version: 1
classifiers:
  - name: a
    category: b
    retryable: maybe
    patterns: [x]
  - name: good
    category: d
    retryable: true
    patterns: ['ok']
  - name: c
    category: d
    retryable: true
    patterns: ["("]
  - name: a
    replace: true
    enabled: false
bogus: 1
"""


def test_a_rule_file_is_validated_on_its_own_and_listed_by_name(cli):
    result = cli("rules", "validate", "rules/20-responses.yaml", "-o", "name")
    assert result.code == 0, result
    names = result.out.split()
    assert names and all(n.startswith("response/") for n in names) and "response/policy_never" in names
    both = json.loads(cli("rules", "validate", "rules/10-catalogue.yaml", "rules/20-responses.yaml", "--json").out)
    assert [f.rsplit("/", 1)[-1] for f in both["files"]] == ["10-catalogue.yaml", "20-responses.yaml"]


def test_every_mistake_of_a_file_is_reported_with_its_line(cli, tmp_path):
    bad = tmp_path / "site.yaml"
    bad.write_text(THREE_MISTAKES)
    result = cli("rules", "validate", str(bad))
    assert result.code == 2 and "Traceback" not in result.err, result
    for line, text in ((5, "'retryable' must be true, false or unknown"), (14, "pattern '(' is not a valid regular expression"),
                       (18, "unknown key 'bogus'")):
        assert f"{bad}:{line}: {text}" in result.err, result
    # The later 'replace' of the refused rule 'a' is not a mistake of its own.
    assert "no earlier classifier" not in result.err
    as_json = json.loads(cli("rules", "validate", str(bad), "-o", "json").out)
    assert as_json["valid"] is False and [e["line"] for e in as_json["errors"]] == [5, 14, 18]


def test_the_loader_collects_the_mistakes_of_every_file_of_a_directory(tmp_path):
    (tmp_path / "10-a.yaml").write_text(THREE_MISTAKES)
    (tmp_path / "20-b.yaml").write_text("version: 1\nlimits:\n  - name: x\n    kind: nonsense\n")
    try:
        load_rules(tmp_path)
    except ConfigErrors as exc:
        assert [(e.path.rsplit("/", 1)[-1], e.line) for e in exc.errors] == [
            ("10-a.yaml", 5), ("10-a.yaml", 14), ("10-a.yaml", 18), ("20-b.yaml", 4)]
        assert str(exc).startswith(f"{tmp_path / '10-a.yaml'}:5: ")
    else:
        raise AssertionError("the invalid files were accepted")


def test_a_missing_rule_file_is_a_usage_error(cli, tmp_path):
    result = cli("rules", "validate", str(tmp_path / "nope.yaml"))
    assert result.code == 2 and "no such rule file or directory" in result.err, result
