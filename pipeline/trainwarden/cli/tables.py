"""Tables that fit the terminal without cutting what people copy.

Rich shrinks every column evenly when a table is too wide, so on an
80-column terminal job ids were cut and counts vanished. Here the widths are
chosen first: ids and counts keep their full width, a narrow terminal first
shortens timestamps, then hides the columns that say least (in the order
each table gives), and the message column takes what is left, cut with an
ellipsis. ``-o wide`` and piped output show every column.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

GAP = 2  # rich's padding between columns: one space either side
MIN_GIVING_WAY = 12  # below this a message says nothing; the table overflows instead
ENOUGH_GIVING_WAY = 24  # a message this wide is worth more than the next column to hide
PIPED_MESSAGE_WIDTH = 90  # piped output: one message per line stays readable in a pager


def short_time(text: str) -> str:
    """``2026-09-21 12:00:00.123`` -> ``09-21 12:00:00``."""
    return text[5:19] if len(text) >= 19 else text


@dataclasses.dataclass(frozen=True)
class Col:
    name: str
    drop: int = 0  # 0: always shown; otherwise hidden on a narrow terminal, lowest number first
    gives_way: bool = False  # takes the room left and is cut with an ellipsis
    compact: Optional[Callable[[str], str]] = None  # a shorter form for a narrow terminal


def time_col(name: str, drop: int = 0) -> Col:
    return Col(name, drop=drop, compact=short_time)


@dataclasses.dataclass
class Layout:
    shown: list[int]  # indices of the columns shown
    widths: dict[int, int]
    compact: bool
    hidden: list[str]


def _natural(columns: Sequence[Col], rows: list[list[str]], index: int, compact: bool) -> int:
    column = columns[index]
    shape = column.compact if compact and column.compact else (lambda s: s)
    return max([cell_len(column.name)] + [cell_len(shape(row[index])) for row in rows])


def layout(columns: Sequence[Col], rows: list[list[str]], width: Optional[int], wide: bool) -> Layout:
    """Which columns to show and how wide, for a terminal of ``width`` columns
    (None: not a terminal)."""
    everything = list(range(len(columns)))
    if width is None or wide:
        widths = {i: _natural(columns, rows, i, False) for i in everything}
        if width is None and not wide:
            for i in everything:
                if columns[i].gives_way:
                    widths[i] = min(widths[i], PIPED_MESSAGE_WIDTH)
        return Layout(everything, widths, False, [])
    droppable = sorted((i for i in everything if columns[i].drop), key=lambda i: columns[i].drop)
    attempts = [(False, [])] + [(True, droppable[:n]) for n in range(len(droppable) + 1)]
    fallback = None
    for compact, dropped in attempts:
        shown = [i for i in everything if i not in dropped]
        widths = {i: _natural(columns, rows, i, compact) for i in shown}
        giving = [i for i in shown if columns[i].gives_way]
        fixed = sum(w for i, w in widths.items() if i not in giving) + GAP * (len(shown) - 1)
        room = width - fixed
        wanted = sum(widths[i] for i in giving)
        plan = Layout(shown, widths, compact, [columns[i].name for i in dropped])
        if room >= wanted:
            return plan
        if giving and room >= min(wanted, ENOUGH_GIVING_WAY * len(giving)):
            _share(widths, giving, room)
            return plan
        if giving and room >= MIN_GIVING_WAY * len(giving):
            fallback = (plan, giving, room)
    if fallback is not None:
        plan, giving, room = fallback
        _share(plan.widths, giving, room)
        return plan
    # Not even the kept columns fit: they stay whole and the lines run over.
    for i in (i for i in plan.shown if columns[i].gives_way):
        plan.widths[i] = min(plan.widths[i], MIN_GIVING_WAY)
    return plan


def _share(widths: dict[int, int], giving: list[int], room: int) -> None:
    """Room left split among the giving-way columns; none gets more than it needs."""
    left = sorted(giving, key=lambda i: widths[i])
    while left:
        fair = room // len(left)
        index = left.pop(0)
        widths[index] = min(widths[index], fair)
        room -= widths[index]


def render(console: Console, title: str, columns: Sequence[Col], rows: Sequence[Sequence[object]], *,
           width: Optional[int], wide: bool = False, headers: bool = True, empty: str = "") -> None:
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if not cells:
        if headers and empty:
            console.print(Text(empty))
        return
    plan = layout(columns, cells, width, wide)
    total = sum(plan.widths.values()) + GAP * (len(plan.shown) - 1)
    t = Table(title=Text(_title(title, plan.hidden, max(total, width or 0))) if headers else None,
              title_justify="left", show_header=headers, header_style="bold", box=None, pad_edge=False)
    for i in plan.shown:
        t.add_column(columns[i].name, width=plan.widths[i], no_wrap=True,
                     overflow="ellipsis" if columns[i].gives_way else "fold")
    for row in cells:
        # Job text is data: a gloo message starts with "[/path/pair.cc:561]",
        # which Rich would read as a closing tag.
        t.add_row(*(Text(columns[i].compact(row[i]) if plan.compact and columns[i].compact else row[i])
                    for i in plan.shown))
    # Rich renders at most the console's width and would squeeze the columns
    # again; a table wider than the terminal (-o wide) runs over instead.
    saved = console.width
    console.width = max(saved, total)
    try:
        with console.capture() as captured:
            console.print(t)
    finally:
        console.width = saved
    # Rich pads every cell to its column's width, the last one too: trailing
    # spaces that a diff, a grep or a copy into an issue would carry.
    console.file.write("".join(line.rstrip(" ") + "\n" for line in captured.get().splitlines()))
    console.file.flush()


def _title(title: str, hidden: list[str], width: int) -> str:
    if not hidden:
        return title
    for note in (f" (hidden here: {', '.join(hidden)}; -o wide shows them)", f" (hidden: {', '.join(hidden)})",
                 " (-o wide shows every column)"):
        if len(title + note) <= width:
            return title + note
    return title
