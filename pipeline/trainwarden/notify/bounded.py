"""A Jinja2 sandbox whose templates cannot compute without bound.

The immutable sandbox keeps a template from changing state, but not from
working forever: ``{{ 9 ** (9 ** 9) }}`` stalls validation and the notifier,
``{{ [1] * 10**8 }}`` takes half a minute, nested ``range`` loops run 10**10
times. Here every operator that can make a value big (``**``, ``*``, ``+``,
``%``) checks the size of what it would make first, the filters that pad or
replace are bounded the same way, and the ``range`` of one render has a
budget. What is refused raises ``SecurityError`` (the template's file and
line are reported like any other render error).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from typing import Any, Iterator

from jinja2.filters import do_center, do_format, do_indent, do_replace, do_wordwrap
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

# Characters or items one value may have: a body is at most 256 KiB anyway.
MAX_SIZE = 256 * 1024
# Bits of an integer a power may make (about 1,200 decimal digits).
MAX_INT_BITS = 4096
# Elements every range() of one render may yield together.
RANGE_BUDGET = 100_000
# A width or precision in a format string ("%0999999999d", "{:>999999}").
_BIG_WIDTH = re.compile(r"\d{6,}")
_budget: contextvars.ContextVar[list[int]] = contextvars.ContextVar("range_budget")


def _sized(value: Any) -> bool:
    return isinstance(value, (str, bytes, list, tuple))


def _refuse(what: str) -> None:
    raise SecurityError(f"{what}: a notification template may not make values that large")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _bounded_range
        self.filters.update(center=_center, indent=_indent, wordwrap=_wordwrap, replace=_replace, format=_format)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            _check_power(left, right)
        elif operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if _sized(sequence) and isinstance(times, int) and len(sequence) * times > MAX_SIZE:
                    _refuse(f"a sequence of {len(sequence)} repeated {times} times")
            if isinstance(left, int) and isinstance(right, int) and \
                    abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                _refuse("a product of that many digits")
        elif operator == "+":
            if _sized(left) and _sized(right) and len(left) + len(right) > MAX_SIZE:
                _refuse(f"a concatenation of {len(left) + len(right)} items")
        elif operator == "%" and isinstance(left, str) and _BIG_WIDTH.search(left):
            _refuse("a format width of a million or more")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any):
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and _BIG_WIDTH.search(owner):
            _refuse("a format width of a million or more")
        return super().wrap_str_format(value)


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, bool) or isinstance(exponent, bool):
        return
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if abs(base).bit_length() * exponent > MAX_INT_BITS:
            _refuse(f"{base} to the power {exponent}")


@contextlib.contextmanager
def range_budget() -> Iterator[None]:
    """One render's budget for range(): nested loops share it."""
    token = _budget.set([RANGE_BUDGET])
    try:
        yield
    finally:
        _budget.reset(token)


def _bounded_range(*args: int) -> range:
    span = range(*args)
    left = _budget.get(None)
    if left is None or len(span) > left[0]:
        _refuse(f"range() of {len(span)} elements in one render")
    left[0] -= len(span)
    return span


def _width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_SIZE:
        _refuse(f"{what} {value}")


def _center(value: Any, width: int = 80) -> str:
    _width(width, "a width of")
    return do_center(value, width)


def _indent(value: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    _width(width, "an indentation of")
    if isinstance(width, str) and len(width) * str(value).count("\n") > MAX_SIZE:
        _refuse("an indentation that long")
    return do_indent(value, width, first, blank)


def _wordwrap(environment, value: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
    _width(width, "a width of")
    return do_wordwrap(environment, value, width, *args, **kwargs)


_wordwrap.jinja_pass_arg = do_wordwrap.jinja_pass_arg  # type: ignore[attr-defined]


def _replace(eval_ctx, value: Any, old: Any, new: Any, count: Any = None) -> Any:
    text, old_text, new_text = str(value), str(old), str(new)
    hits = text.count(old_text) if old_text else len(text) + 1
    if len(text) + hits * max(len(new_text) - len(old_text), 0) > MAX_SIZE:
        _refuse("a replacement that long")
    return do_replace(eval_ctx, value, old, new, count)


_replace.jinja_pass_arg = do_replace.jinja_pass_arg  # type: ignore[attr-defined]


def _format(value: str, *args: Any, **kwargs: Any) -> str:
    if _BIG_WIDTH.search(str(value)):
        _refuse("a format width of a million or more")
    return do_format(value, *args, **kwargs)
