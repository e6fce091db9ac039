"""Terminal output: tables with rich, JSON for machines, one-sentence errors."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Iterable, Sequence

from rich.console import Console
from rich.markup import escape

from trainwarden.cli.tables import Col, render
from trainwarden.events import Decision, DecisionKind, LogLine, Stream
from trainwarden.hints import OUTCOME_HINTS

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
# Piped output keeps whole rows rather than wrapping at rich's default of 80 columns.
out_console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 100_000)


class ExamplesFormatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal as usual; the examples epilog as
    written, one command a line (wrapped, they could not be copied)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def examples(*lines: str, args_flags: bool = False) -> dict:
    """``add_parser`` keywords for an "examples:" epilog; ``args_flags``: then
    the flags of the arguments string (--args), so that --help is the flag table."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
    if args_flags:
        epilog += "\n\n" + args_flags_text()
    return {"epilog": epilog, "formatter_class": ExamplesFormatter}


def args_flags_text() -> str:
    """The flags --args (a job file's args:) takes, with default and meaning, one a line."""
    from trainwarden.settings import defaults_table

    import textwrap

    lines = ["flags of --args (and of a job file's args:), with their defaults:"]
    for flag, default, meaning in defaults_table():
        # Two lines a flag: an 80-column terminal shows them unwrapped.
        lines.append(f"  {flag}={default}")
        lines += textwrap.wrap(meaning, width=78, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def plural(count: int, noun: str, after: str = "") -> str:
    """``1 job restart``, ``2 job restarts``; ``after`` follows the noun (``2 lines`` `` cut at 16 KiB``)."""
    ending = "" if count == 1 else "es" if noun.endswith(("s", "sh", "ch", "x")) else "s"
    return f"{count} {noun}{ending}{after}"


def print_outcome(job_id: str, status: str, reason: str, restarts: int, *, extra: str = "",
                  history: str = "") -> None:
    """The last lines of `run` and `submit --follow`: outcome, restarts, where the history is, and a hint."""
    colour = "green" if status == "succeeded" else "red"
    err_console.print(f"[{colour}]trainwarden ▸ job {_escape(job_id)} {status}[/]" + (f" ({reason})" if reason else "")
                      + f"; {plural(restarts, 'job restart')}{_escape(extra)}. History: {_escape(history)}")
    if reason in OUTCOME_HINTS:
        err_console.print(f"trainwarden ▸ {OUTCOME_HINTS[reason]}", markup=False)


def fail(message: str, hint: str = "", code: int = 2) -> int:
    err_console.print(f"[bold red]trainwarden: error:[/] {_escape(message)}")
    if hint:
        err_console.print(f"[dim]hint: {_escape(hint)}[/]")
    return code


def _escape(text: str) -> str:
    return escape(text)


def iso(ts: float) -> str:
    """UTC, to the millisecond, readable in a table."""
    if not ts:
        return ""
    moment = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


def terminal_width() -> int | None:
    """The terminal's width, or None when the output is piped (whole rows then)."""
    return out_console.width if out_console.is_terminal else None


EMPTY = "nothing recorded yet."


def table(title: str, columns: Sequence[str | Col], rows: Iterable[Sequence[object]], wide: Sequence[str] = (),
          *, headers: bool = True, show_all: bool = False, empty: str = EMPTY) -> None:
    """Columns named in ``wide`` (or Col(gives_way=True)) take the room left and are cut with an ellipsis."""
    spec = [c if isinstance(c, Col) else Col(c, gives_way=c in wide) for c in columns]
    render(out_console, title, spec, list(rows), width=terminal_width(), wide=show_all, headers=headers,
           empty=f"{title}: {empty}")


# ------------------------------------------------------------------ -o FORMAT

FORMATS = ("table", "wide", "json", "name")


def add_output_options(parser, names: str = "", wide: str = "") -> None:
    """``-o table|wide|json|name``, ``--json`` (the same as -o json) and
    ``--no-headers``. ``names`` says what -o name prints (none: not offered);
    ``wide`` what -o wide adds to the table."""
    choices = [f for f in FORMATS if f != "name" or names]
    described = {"table": "a table fitted to the terminal (default)",
                 "wide": "every column, nothing cut" + (f" (adds {wide})" if wide else ""),
                 "json": "JSON for machines", "name": f"one {names} per line"}
    parser.add_argument("-o", "--output", choices=choices, default=None, metavar="FORMAT",
                        help="; ".join(f"{c}: {described[c]}" for c in choices))
    parser.add_argument("--json", action="store_true", help="the same as -o json")
    parser.add_argument("--no-headers", action="store_true", help="tables without title and header line, "
                                                                  "for scripts")


def output_format(args) -> str:
    chosen = getattr(args, "output", None)
    if getattr(args, "json", False):
        if chosen not in (None, "json"):
            raise UsageError(f"--json and -o {chosen} disagree", hint="give one of them")
        return "json"
    if getattr(args, "wide", False):
        if chosen not in (None, "wide", "table"):
            raise UsageError(f"--wide and -o {chosen} disagree", hint="give one of them")
        return "wide"
    return chosen or "table"


class UsageError(Exception):
    """A usage mistake found after parsing; main prints it and exits 2."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def listing(args, title: str, columns: Sequence[str | Col], rows: Iterable[Sequence[object]], *,
            data: object, names: Iterable[str] = (), empty: str = EMPTY) -> int:
    """One list in the format asked for; ``data`` is what -o json prints."""
    fmt = output_format(args)
    if fmt == "json":
        print_json(data)
    elif fmt == "name":
        for name in dict.fromkeys(names):  # once each, in order
            out_console.file.write(f"{name}\n")
    else:
        table(title, columns, rows, headers=not getattr(args, "no_headers", False), show_all=fmt == "wide",
              empty=empty)
    return 0


_ACTION_STYLE = {
    DecisionKind.RESTART_JOB: "yellow",
    DecisionKind.RESTART_INSTANCE: "yellow",
    DecisionKind.FAIL_JOB: "bold red",
    DecisionKind.NOTIFY: "cyan",
    DecisionKind.COMPLETE_JOB: "green",
}


_SPOT_STEPS = (DecisionKind.QUEUE_JOB, DecisionKind.START_JOB, DecisionKind.RESUME_JOB)


def _cost_text(d: Decision) -> str:
    c = d.cost
    return (f"paid {c.paid:.4f} vs on-demand {c.on_demand:.4f}, held {c.held_s:.1f} s, queued {c.queued_s:.1f} s, "
            f"{c.preemptions} preemptions")


class ConsoleReporter:
    """What ``trainwarden run`` prints: instance output with a ``[worker-1]``
    prefix on stdout/stderr, and the engine's decisions on stderr."""

    def __init__(self, quiet_output: bool = False):
        self.quiet_output = quiet_output

    def line(self, event: LogLine) -> None:
        if self.quiet_output:
            return
        stream = sys.stderr if event.stream is Stream.STDERR else sys.stdout
        try:
            # Flushed by flush() when the run is idle or at a tick, not per line:
            # a chatty job must not be slowed down by its own echo.
            stream.write(f"[{event.instance}] {event.text}\n")
        except (BrokenPipeError, ValueError, OSError):
            self.quiet_output = True

    def flush(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.quiet_output = True

    def decision(self, d: Decision) -> None:
        self.flush()  # the instances' lines that led to it come first
        style = _ACTION_STYLE.get(d.kind, "magenta")
        if d.cost is not None and d.kind in _SPOT_STEPS:
            err_console.print(f"[blue]trainwarden ▸ spot {d.kind.value}: {_escape(d.error_message)}[/] "
                              f"[dim]round {d.round}, {_cost_text(d)}[/]")
            return
        if d.kind is DecisionKind.START_JOB:
            return
        if d.kind is DecisionKind.COMPLETE_JOB:
            err_console.print(f"[{style}]trainwarden ▸ every instance finished: the job succeeded[/]"
                              + (f" [dim]spot {_cost_text(d)}[/]" if d.cost is not None else ""))
            return
        if d.kind is DecisionKind.NOTIFY:
            who = d.instance or "the job"  # a job's own row (custom_messages_dropped) names no instance
            err_console.print(f"[{style}]trainwarden ▸ message from {who}: {_escape(d.error_message)}[/]")
            return
        what = d.error_source.value if d.error_source else "job"
        who = f"{d.instance} " if d.instance else ""
        code = f" (exit code {d.error_code})" if d.error_code else ""
        judged = ""
        if d.classifier and d.classifier != d.rule:
            # "connection_lost by connection_lost" said one thing twice.
            judged = f", {d.category}" + (f" by {d.classifier}" if d.classifier != d.category else "")
        err_console.print(
            f"[{style}]trainwarden ▸ {who}{what}{code}{judged} → {d.kind.value}[/] "
            f"[dim]reason {d.reason.value}, rule {d.rule}, round {d.round}[/]")
        if d.error_message:
            err_console.print(f"[dim]  {_escape(d.error_message[:300])}[/]")
        if d.cost is not None:
            err_console.print(f"[dim]  spot {_cost_text(d)}[/]")

    def info(self, text: str) -> None:
        err_console.print(f"[dim]trainwarden ▸ {_escape(text)}[/]")



def add_log_file_options(parser) -> None:
    """``--log-file-max-mb`` and ``--log-files-kept``: where instance output
    files are written (``run --log-dir``, every agent), each rotates at a size
    (runtime/logfiles.py). An environment value is checked like a flag's
    (argparse converts a string default)."""
    import os

    from trainwarden.runtime.logfiles import DEFAULT_KEEP, DEFAULT_MAX_MB

    parser.add_argument("--log-file-max-mb", type=int, metavar="MIB",
                        default=os.environ.get("TRAINWARDEN_LOG_FILE_MAX_MB") or DEFAULT_MAX_MB,
                        help=f"an instance output file rotates at this size (default {DEFAULT_MAX_MB}) "
                             "[env TRAINWARDEN_LOG_FILE_MAX_MB]")
    parser.add_argument("--log-files-kept", type=int, metavar="N",
                        default=os.environ.get("TRAINWARDEN_LOG_FILES_KEPT") or DEFAULT_KEEP,
                        help=f"rotated files kept per output file, NAME.1 .. NAME.N (default {DEFAULT_KEEP}) "
                             "[env TRAINWARDEN_LOG_FILES_KEPT]")
