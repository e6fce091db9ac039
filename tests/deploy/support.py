"""Shared helpers for the deployment-file tests: paths, YAML loading, the
subcommands the manifests may use, Vector's environment interpolation, a
small reader of VRL object literals, and the example messages of
docs/MESSAGES.md."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VECTOR_CONFIG = DEPLOY / "vector" / "vector.yaml"
VECTOR_TESTS = DEPLOY / "vector" / "vector_test.yaml"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
MESSAGES_DOC = ROOT / "docs" / "MESSAGES.md"

TRAINWARDEN_IMAGE = "ghcr.io/trainwarden/trainwarden:0.1.0"
# Every subcommand of the trainwarden CLI, present or being added. Manifests
# may use only these.
KNOWN_SUBCOMMANDS = {"run", "history", "classify", "rules", "agent", "processor", "actuator", "submit", "nodes",
                     "kafka"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


# ---------------------------------------------------------------- the CLI


def cli_subcommands() -> dict[str, argparse.ArgumentParser]:
    """The subcommands that trainwarden.cli.main.build_parser() has today."""
    from trainwarden.cli.main import build_parser

    parser = build_parser()
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_cli(argv: list[str]) -> Optional[str]:
    """None when the real parser accepts ``trainwarden argv``, else its message."""
    from trainwarden.cli.main import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        return stderr.getvalue().strip() or f"exit {exc.code}"
    return None


# ------------------------------------------------ Vector's interpolation

# Vector's own pattern (src/config/vars.rs): $$, $NAME, ${NAME}, ${NAME:-default},
# ${NAME-default}, ${NAME:?error}, ${NAME?error}.
_VECTOR_VAR = re.compile(r"\$\$|\$([\w.]+)|\$\{([\w.]+)(?:(:?-|:?\?)([^}]*))?\}")


def vector_interpolate(text: str, env: dict[str, str]) -> tuple[str, list[str]]:
    """(text, errors) as Vector interpolates the environment into a value."""
    errors: list[str] = []

    def substitute(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name is None:
            return "$"
        flag, extra = match.group(3) or "", match.group(4) or ""
        value = env.get(name)
        if flag == ":-":
            return value if value else extra
        if flag == "-":
            return extra if value is None else value
        if flag == ":?":
            if not value:
                errors.append(name)
                return ""
            return value
        if flag == "?":
            if value is None:
                errors.append(name)
                return ""
            return value
        if value is None:
            errors.append(name)
            return ""
        return value

    return _VECTOR_VAR.sub(substitute, text), errors


def interpolate_tree(value: Any, env: dict[str, str], errors: list[str]) -> Any:
    if isinstance(value, str):
        text, missing = vector_interpolate(value, env)
        errors.extend(missing)
        return text
    if isinstance(value, list):
        return [interpolate_tree(item, env, errors) for item in value]
    if isinstance(value, dict):
        return {key: interpolate_tree(item, env, errors) for key, item in value.items()}
    return value


# ------------------------------------------------------------- VRL reading


def _scan(text: str) -> Iterator[tuple[int, str, int]]:
    """(index, char, depth) of the characters of VRL code outside strings,
    regex/raw/timestamp literals and comments; depth counts ( [ {."""
    depth = 0
    index = 0
    while index < len(text):
        char = text[index]
        if char == "#":
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        if char in "rst" and index + 1 < len(text) and text[index + 1] == "'" and \
                (index == 0 or not (text[index - 1].isalnum() or text[index - 1] == "_")):
            end = text.index("'", index + 2)
            index = end + 1
            continue
        if char == '"':
            index += 1
            while text[index] != '"':
                index += 2 if text[index] == "\\" else 1
            index += 1
            continue
        if char in "([{":
            yield index, char, depth
            depth += 1
        elif char in ")]}":
            depth -= 1
            yield index, char, depth
        else:
            yield index, char, depth
        index += 1


def root_assignments(vrl: str) -> list[str]:
    """The object literal (its text, braces included) of every ``. = {...}``."""
    found = []
    for match in re.finditer(r"(?m)^\s*\.\s*=\s*\{", vrl):
        start = match.end() - 1
        for index, char, depth in _scan(vrl[start:]):
            if char == "}" and depth == 0:
                found.append(vrl[start:start + index + 1])
                break
    return found


def object_entries(literal: str) -> dict[str, str]:
    """``{"k": expr, ...}`` -> {k: expr text} (top-level entries only)."""
    inner = literal.strip()[1:-1]
    parts, last = [], 0
    for index, char, depth in _scan(inner):
        if char == "," and depth == 0:
            parts.append(inner[last:index])
            last = index + 1
    if inner[last:].strip():
        parts.append(inner[last:])
    entries = {}
    for part in parts:
        key, _, expr = part.strip().partition(":")
        entries[json.loads(key.strip())] = expr.strip()
    return entries


def path_assignments(vrl: str) -> list[str]:
    """Event paths assigned other than the root (``.foo = ...``, ``.a.b = ...``)."""
    return re.findall(r"(?m)^\s*(\.[A-Za-z_][\w.]*)\s*=(?!=)", vrl)


def regex_literals(vrl: str) -> list[str]:
    return re.findall(r"parse_regex\(\s*[\w.]+\s*,\s*r'([^']*)'\s*\)", vrl)


# --------------------------------------------------- docs/MESSAGES.md


def documented_messages() -> dict[str, dict]:
    """type -> the example JSON object of that message type in docs/MESSAGES.md
    (examples spread over several lines are joined; non-JSON ones skipped)."""
    text = MESSAGES_DOC.read_text(encoding="utf-8")
    examples: dict[str, dict] = {}
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.S):
        objects: list[str] = []
        for line in block.splitlines():
            if line.startswith("{"):
                objects.append(line)
            elif objects:
                objects[-1] += line
        for candidate in objects:
            try:
                value = json.loads(candidate)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and "type" in value:
                examples.setdefault(value["type"], value)
    return examples
