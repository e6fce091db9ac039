"""Grafana's query text, expanded two ways.

The product queries (analytics.py) are written once, in the dialect of the
Grafana ClickHouse data source (grafana-clickhouse-datasource): template
variables such as ``${job:sqlstring}`` and the plugin's macros such as
``$__timeFilter_ms(time)``. Dashboards embed that text unchanged.

- ``expand_grafana`` does what Grafana and the plugin do to it before it
  reaches ClickHouse: Grafana interpolates the variables in the browser, then
  the plugin's backend (pkg/macros/macros.go) replaces the macros with
  literals. The dashboard tests run its output on chDB. It follows the
  plugin at ``PLUGIN_VERSION`` (trainwarden/dashboards.py), the version the
  compose file installs; tests/store/test_plugin_macros.py holds it to that
  version's own expected strings. (From 4.19.0 the plugin expands macros
  with macropro, which also skips macros inside comments and leaves unknown
  ones in place; here an unknown macro is an error.)
- ``to_parameters`` turns the same text into a statement with ClickHouse
  query parameters (``{job:String}``), which is what the CLI runs: user input
  never becomes SQL text.

Only the forms listed in ``VARIABLES`` and ``_MACROS`` exist; anything else is
a ``MacroError``, so a typo in a query fails its test instead of reaching
Grafana unexpanded.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping, Sequence, Union

# Template variables of the dashboards and the ClickHouse type of each as a query parameter.
VARIABLES = {"job": "String", "node": "String", "source": "String", "limit": "UInt64"}
# The value of a variable's "All" option: queries test for it explicitly, so
# that one text serves a chosen value and "everything".
ALL = "__all"

_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]|\$([A-Za-z]\w*)")
_MACRO = re.compile(r"\$__(\w+)")


class MacroError(ValueError):
    """A query uses a macro or a variable form that is not supported."""


@dataclasses.dataclass(frozen=True)
class TimeRange:
    """What Grafana sends with a query: the picker's range and the panel's interval, in milliseconds."""

    from_ms: int
    to_ms: int
    interval_ms: int = 60_000


VariableValue = Union[str, int, Sequence[str]]


# ------------------------------------------------------------------ variables

def _sqlstring(value: VariableValue) -> str:
    # Grafana's sqlstring format: each value quoted, ' doubled, joined by commas.
    values = [value] if isinstance(value, (str, int)) else list(value)
    return ",".join("'" + str(v).replace("'", "''") + "'" for v in values)


def _singlequote(value: VariableValue) -> str:
    values = [value] if isinstance(value, (str, int)) else list(value)
    return ",".join("'" + str(v).replace("'", "\\'") + "'" for v in values)


def _raw(value: VariableValue) -> str:
    if isinstance(value, (str, int)):
        return str(value)
    values = list(value)
    # Grafana's default for several values in an SQL data source: {a,b}.
    return values[0] if len(values) == 1 else "{" + ",".join(values) + "}"


_FORMATS: dict[str | None, Callable[[VariableValue], str]] = {
    None: _raw, "raw": _raw, "sqlstring": _sqlstring, "singlequote": _singlequote,
}


def _variable_matches(sql: str):
    for match in _VARIABLE.finditer(sql):
        name = match.group(1) or match.group(3) or match.group(5)
        fmt = match.group(2) or match.group(4)
        if name.startswith("__"):
            continue  # Grafana's built-ins ($__interval ...) and the plugin's macros
        yield match, name, fmt


def variables_used(sql: str) -> set[str]:
    return {name for _, name, _ in _variable_matches(sql)}


def interpolate(sql: str, values: Mapping[str, VariableValue]) -> str:
    """Grafana's interpolation of template variables (a variable it does not know stays as it is)."""
    out, last = [], 0
    for match, name, fmt in _variable_matches(sql):
        if name not in values:
            continue
        if fmt not in _FORMATS:
            raise MacroError(f"variable format {fmt!r} of ${{{name}}} is not supported")
        out.append(sql[last:match.start()])
        out.append(_FORMATS[fmt](values[name]))
        last = match.end()
    out.append(sql[last:])
    return "".join(out)


# --------------------------------------------------------------------- macros

def _datetime(ms: int) -> str:
    # toDateTime(<unix seconds>): Go's time.Unix() rounds towards minus infinity.
    return f"toDateTime({ms // 1000})"


def _datetime64(ms: int) -> str:
    return f"fromUnixTimestamp64Milli({ms})"


def _date(ms: int) -> str:
    import datetime

    day = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"toDate('{day}')"


def _one(name: str, args: list[str]) -> str:
    if len(args) != 1:
        raise MacroError(f"$__{name} expects 1 argument, received {len(args)}")
    return args[0]


def _date_time_filter(r: TimeRange, args: list[str]) -> str:
    # A Date column for the partition and a DateTime column for the exact range.
    if len(args) != 2:
        raise MacroError(f"$__dateTimeFilter expects 2 arguments, received {len(args)}")
    day, moment = args
    return (f"({day} >= {_date(r.from_ms)} AND {day} <= {_date(r.to_ms)}) AND "
            f"({moment} >= {_datetime(r.from_ms)} AND {moment} <= {_datetime(r.to_ms)})")


def _literal_macros(r: TimeRange) -> dict[str, Callable[[list[str]], str]]:
    seconds = max(r.interval_ms // 1000, 1)
    return {
        "fromTime": lambda a: _datetime(r.from_ms),
        "toTime": lambda a: _datetime(r.to_ms),
        "fromTime_ms": lambda a: _datetime64(r.from_ms),
        "toTime_ms": lambda a: _datetime64(r.to_ms),
        "timeFilter": lambda a: (f"{_one('timeFilter', a)} >= {_datetime(r.from_ms)}"
                                 f" AND {a[0]} <= {_datetime(r.to_ms)}"),
        "timeFilter_ms": lambda a: (f"{_one('timeFilter_ms', a)} >= {_datetime64(r.from_ms)}"
                                    f" AND {a[0]} <= {_datetime64(r.to_ms)}"),
        "dateFilter": lambda a: f"{_one('dateFilter', a)} >= {_date(r.from_ms)} AND {a[0]} <= {_date(r.to_ms)}",
        "dateTimeFilter": lambda a: _date_time_filter(r, a),
        "dt": lambda a: _date_time_filter(r, a),
        "timeInterval": lambda a: f"toStartOfInterval(toDateTime({_one('timeInterval', a)}), INTERVAL {seconds} second)",
        "timeInterval_ms": lambda a: (f"toStartOfInterval(toDateTime64({_one('timeInterval_ms', a)}, 3),"
                                      f" INTERVAL {max(r.interval_ms, 1)} millisecond)"),
        "interval_s": lambda a: str(seconds),
    }


_FROM = "{__from_ms:Int64}"
_TO = "{__to_ms:Int64}"
_INTERVAL = "{__interval_s:UInt32}"

# The same macros with query parameters instead of literals.
_PARAMETER_MACROS: dict[str, Callable[[list[str]], str]] = {
    "fromTime": lambda a: f"toDateTime(intDiv({_FROM}, 1000))",
    "toTime": lambda a: f"toDateTime(intDiv({_TO}, 1000))",
    "fromTime_ms": lambda a: f"fromUnixTimestamp64Milli({_FROM})",
    "toTime_ms": lambda a: f"fromUnixTimestamp64Milli({_TO})",
    "timeFilter": lambda a: (f"{_one('timeFilter', a)} >= toDateTime(intDiv({_FROM}, 1000))"
                             f" AND {a[0]} <= toDateTime(intDiv({_TO}, 1000))"),
    "timeFilter_ms": lambda a: (f"{_one('timeFilter_ms', a)} >= fromUnixTimestamp64Milli({_FROM})"
                                f" AND {a[0]} <= fromUnixTimestamp64Milli({_TO})"),
    "timeInterval": lambda a: (f"toStartOfInterval(toDateTime({_one('timeInterval', a)}),"
                               f" toIntervalSecond({_INTERVAL}))"),
    "interval_s": lambda a: _INTERVAL,
}


def _arguments(sql: str, start: int) -> tuple[list[str], int]:
    """The comma-separated arguments of a macro call whose '(' is at ``start``; and the end."""
    depth, index = 0, start
    while index < len(sql):
        char = sql[index]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                inner = sql[start + 1:index]
                return [part.strip() for part in inner.split(",")] if inner.strip() else [], index + 1
        index += 1
    raise MacroError(f"unbalanced parentheses after a macro at offset {start}")


def _apply_macros(sql: str, macros: Mapping[str, Callable[[list[str]], str]]) -> str:
    out, last = [], 0
    for match in _MACRO.finditer(sql):
        if match.start() < last:
            continue
        name = match.group(1)
        if name not in macros:
            raise MacroError(f"unknown macro $__{name}")
        end = match.end()
        args: list[str] = []
        if end < len(sql) and sql[end] == "(":
            args, end = _arguments(sql, end)
        out.append(sql[last:match.start()])
        out.append(macros[name](args))
        last = end
    out.append(sql[last:])
    return "".join(out)


def expand_grafana(sql: str, time_range: TimeRange, values: Mapping[str, VariableValue]) -> str:
    """The text ClickHouse receives from Grafana for this panel query."""
    missing = variables_used(sql) - set(values)
    if missing:
        raise MacroError(f"no value for the variables {sorted(missing)}")
    return _apply_macros(interpolate(sql, values), _literal_macros(time_range))


def to_parameters(sql: str) -> str:
    """The same query with ClickHouse query parameters: ``{job:String}``,
    ``{__from_ms:Int64}``, ``{__to_ms:Int64}``, ``{__interval_s:UInt32}``.

    String variables must be written ``${name:sqlstring}`` (the only form
    Grafana quotes), numbers as ``${name}``."""
    out, last = [], 0
    for match, name, fmt in _variable_matches(sql):
        kind = VARIABLES.get(name)
        if kind is None:
            raise MacroError(f"unknown variable ${{{name}}}")
        if (kind == "String") != (fmt == "sqlstring") or (fmt not in (None, "sqlstring")):
            raise MacroError(f"variable ${{{name}}} must be written "
                             + ("${%s:sqlstring}" % name if kind == "String" else "${%s}" % name))
        out.append(sql[last:match.start()])
        out.append(f"{{{name}:{kind}}}")
        last = match.end()
    out.append(sql[last:])
    return _apply_macros("".join(out), _PARAMETER_MACROS)
