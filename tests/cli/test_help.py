"""Every command's --help has examples that parse, and every option of every command says what it does."""

import argparse
import shlex

import pytest

from trainwarden.cli import cluster_cmd, report_cmd
from trainwarden.cli.main import _join_args_value, build_parser

# The cluster commands and the report have their own owners and tests of their help.
OTHERS = cluster_cmd.COMMANDS | report_cmd.COMMANDS


def parsers(parser: argparse.ArgumentParser, path: str = ""):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}".strip())


ALL = list(parsers(build_parser()))
OURS = [(path, p) for path, p in ALL if path.split(" ")[0] not in OTHERS]


def test_every_option_and_argument_of_every_command_has_help():
    missing = [(path or "trainwarden", a.option_strings or a.dest) for path, p in ALL for a in p._actions
               if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert missing == []


@pytest.mark.parametrize("path,parser", OURS, ids=[path or "trainwarden" for path, _ in OURS])
def test_help_shows_examples_that_parse(path, parser):
    text = parser.format_help()
    assert "\nexamples:\n" in text, path
    # The examples block; `run` and `submit` list the flags of --args after it.
    lines = [line.strip() for line in parser.epilog.split("\n\n")[0].split("\n")[1:] if line.strip()]
    assert lines, path
    for line in lines:
        words = shlex.split(line.split("|")[-1].split(">")[0], comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # VARIABLE=value before the command
        if not words or words[0] != "trainwarden":
            continue  # e.g. source <(trainwarden completion bash)
        argv = words[1:]
        if "--" in argv:
            argv = argv[:argv.index("--")]
        if "COMMAND" in argv:
            continue
        try:
            build_parser().parse_args(_join_args_value(argv))
        except SystemExit as exc:
            pytest.fail(f"the example {line!r} of '{path}' does not parse (exit {exc.code})")


@pytest.mark.parametrize("path,parser", OURS, ids=[path or "trainwarden" for path, _ in OURS])
def test_descriptions_wrap_to_an_80_column_terminal_and_examples_stay_whole(path, parser, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = parser.format_help()
    head = text.split("\n\n", 1)[1] if "\n\n" in text else ""  # after the usage block
    description = head.split("\n\n", 1)[0] if not head.startswith(("options:", "positional")) else ""
    assert all(len(line) <= 80 for line in description.splitlines()), (path, description)
    shown = text.split("\nexamples:\n", 1)[1].splitlines()
    for line in (line for line in parser.epilog.split("\n\n")[0].split("\n")[1:] if line.startswith("  ")):
        assert line in shown, (path, line)  # one command a line, as written: it can be copied
