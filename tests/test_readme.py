"""The README is part of the interface: its flag table must match the parser."""

import re
from pathlib import Path

from trainwarden.settings import defaults_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_readme_lists_every_flag_with_its_default():
    for flag, default, _ in defaults_table():
        assert re.search(rf"^\| `{re.escape(flag)}` \| `{re.escape(default)}` \|", README, re.M), flag


def test_the_readme_gives_the_two_commands():
    assert "make example" in README and "make test" in README
