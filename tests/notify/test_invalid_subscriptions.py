"""One file per invalid subscription case: each names its expected error and line in its header."""

import re
import shutil
from pathlib import Path

import pytest

from trainwarden.notify import load_subscriptions
from trainwarden.yamlsrc import ConfigError

CASES = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str:
    match = re.search(rf"^# {key}: (.*)$", path.read_text(), re.M)
    assert match, f"{path.name} has no '# {key}:' header"
    return match.group(1).strip()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_an_invalid_subscription_file_is_refused_naming_file_and_line(case: Path, tmp_path: Path):
    target = tmp_path / case.name
    shutil.copy(case, target)
    with pytest.raises(ConfigError) as caught:
        load_subscriptions(tmp_path)
    message = str(caught.value)
    assert _header(case, "error") in message, message
    assert message.startswith(f"{target}:{_header(case, 'line')}:"), message


def test_there_is_a_case_file_for_each_kind_of_mistake():
    assert len(CASES) >= 30
