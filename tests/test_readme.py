"""The README is part of the interface: its tables are what the commands say,
and it stays short enough to read in ten minutes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT, TRAINWARDEN
from trainwarden.settings import defaults_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
MOST_LINES = 400


def _table_after(heading: str) -> list[list[str]]:
    """The rows (header first, separator left out) of the first table under a heading."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not re.fullmatch(r"[-:| ]+", line)]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in rows]


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def test_the_readme_flag_table_is_exactly_the_flags_with_their_defaults_and_meanings():
    header, *rows = _table_after("Flags")
    assert header == ["flag", "default", "meaning"]
    assert [(_unquote(f), _unquote(d), m) for f, d, m in rows] == list(defaults_table())


def test_the_readme_runtimes_table_is_what_trainwarden_runtimes_lists():
    listed = json.loads(subprocess.run([*TRAINWARDEN, "runtimes", "-o", "json"], cwd=ROOT, capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    wide = subprocess.run([*TRAINWARDEN, "runtimes", "-o", "wide"], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60).stdout.splitlines()
    columns = re.split(r"\s{2,}", next(line for line in wide if line.startswith("runtime ")).strip())
    header, *rows = _table_after("Where a job runs: the runtimes")
    assert header == columns
    capabilities = columns[3:]
    expected = [[f"`{r['name']}`", r["summary"], f"`{r['command']}`",
                 *("yes" if c.replace(" ", "_") in r["capabilities"] else "-" for c in capabilities)]
                for r in listed]
    assert rows == expected


def test_the_readme_gives_the_two_commands():
    assert "make example" in README and "make test" in README


def test_the_readme_is_read_in_ten_minutes():
    assert len(README.splitlines()) <= MOST_LINES
