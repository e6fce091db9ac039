"""YAML loading that remembers where every value came from.

Config errors must name the file and the line; PyYAML's node marks carry
that, so mappings and sequences are built as subclasses that keep the line of
each key and item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """An invalid config file; the message already names file and line."""

    def __init__(self, message: str, path: str | Path = "", line: int = 0, hint: str = ""):
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(where + message)
        self.path = str(path)
        self.line = line
        self.hint = hint


class ConfigErrors(ConfigError):
    """Every mistake found in a set of config files, in the order found; its
    text is one ``file:line: message`` per line, the first mistake first."""

    def __init__(self, errors: list[ConfigError]):
        first = errors[0]
        super().__init__("")
        self.args = ("\n".join(str(e) for e in errors),)
        self.path, self.line, self.hint = first.path, first.line, first.hint
        self.errors = list(errors)


class LineDict(dict):
    line: int = 0
    key_lines: dict

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    line: int = 0
    item_lines: list

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise ConfigError("mapping keys must be plain scalars", line=key_node.start_mark.line + 1)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(text: str | bytes, path: str | Path = "<string>") -> Any:
    """Parse one YAML document; syntax errors become ConfigError with the line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"not UTF-8 text (byte {exc.start})", path) from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        # An unclosed bracket or quote is reported at the end of the file; the
        # place where it was opened (the context) is where to look.
        mark = exc.context_mark or exc.problem_mark
        line = mark.line + 1 if mark else 0
        problem = exc.problem or "invalid YAML"
        if exc.context and exc.problem_mark:
            problem += f" ({exc.context}, found at line {exc.problem_mark.line + 1})"
        raise ConfigError(f"invalid YAML: {problem}", path, line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path) from None


def load_yaml_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", path) from None
    return load_yaml(data, path)


class Fields:
    """Strict access to one mapping of a config file.

    Each getter checks the type and records the key as known; ``done()``
    rejects every key nobody asked for, naming its line.
    """

    def __init__(self, mapping: Any, path: str | Path, what: str, line: int = 0, known: tuple[str, ...] = ()):
        if not isinstance(mapping, dict):
            raise ConfigError(f"{what} must be a mapping", path, getattr(mapping, "line", line) or line)
        self.mapping = mapping
        self.path = path
        self.what = what
        self.seen: set[str] = set()
        if known:
            # Checked first: a misspelt key explains a "missing" one better.
            self.seen.update(known)
            self.done()

    def line(self, key: str | None = None) -> int:
        if key is not None and isinstance(self.mapping, LineDict):
            return self.mapping.line_of(key)
        return getattr(self.mapping, "line", 0)

    def error(self, key: str | None, message: str, hint: str = "") -> ConfigError:
        return ConfigError(message, self.path, self.line(key), hint)

    def get(self, key: str, kinds: type | tuple[type, ...], default: Any = ..., what: str = "") -> Any:
        self.seen.add(key)
        if key not in self.mapping:
            if default is ...:
                raise self.error(None, f"{self.what} needs '{key}'")
            return default
        value = self.mapping[key]
        # bool is an int in Python; a YAML "true" is never an acceptable number.
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            raise self.error(key, f"'{key}' must be {what or _kind_name(kinds)}, not {value!r}")
        if not isinstance(value, kinds):
            raise self.error(key, f"'{key}' must be {what or _kind_name(kinds)}, not {value!r}")
        return value

    def done(self) -> None:
        unknown = self.unknown()
        if unknown:
            raise unknown[0]

    def unknown(self) -> list[ConfigError]:
        """One error for each key nobody asked for."""
        known = ", ".join(sorted(self.seen))
        return [self.error(key, f"unknown key '{key}' in {self.what}", hint=f"known keys: {known}")
                for key in self.mapping if key not in self.seen]


def _kind_name(kinds: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "a mapping"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)
