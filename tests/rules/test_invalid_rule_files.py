"""One file per invalid case: each names its expected error and line in its header."""

import re
import shutil
from pathlib import Path

import pytest

from trainwarden.rules.loader import load_rules, shipped_rules_dir
from trainwarden.yamlsrc import ConfigError

CASES = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str:
    match = re.search(rf"^# {key}: (.*)$", path.read_text(), re.M)
    assert match, f"{path.name} has no '# {key}:' header"
    return match.group(1).strip()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_an_invalid_rule_file_is_refused_naming_file_and_line(case: Path, tmp_path: Path):
    for shipped in sorted(shipped_rules_dir().glob("*.yaml")):
        shutil.copy(shipped, tmp_path / shipped.name)
    target = tmp_path / f"90-{case.name}"
    shutil.copy(case, target)
    with pytest.raises(ConfigError) as caught:
        load_rules(tmp_path)
    message = str(caught.value)
    assert _header(case, "error") in message
    assert message.startswith(f"{target}:{_header(case, 'line')}:"), message


def test_there_is_a_case_file_for_each_kind_of_mistake():
    assert len(CASES) >= 15
