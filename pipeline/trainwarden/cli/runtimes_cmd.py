"""``trainwarden runtimes``: where jobs can run and what each runtime can do."""

from __future__ import annotations

import argparse

from trainwarden.cli.output import add_output_options, examples, listing
from trainwarden.cli.tables import Col
from trainwarden.runtime.base import Capability
from trainwarden.runtime.registry import runtimes

COMMANDS = {"runtimes"}
TAKES_COMMAND: set = set()


def add_commands(sub) -> None:
    parser = sub.add_parser("runtimes", help="the runtimes jobs can run on, and what each can do",
                            **examples("trainwarden runtimes", "trainwarden runtimes -o json",
                                       "trainwarden runtimes -o name"))
    add_output_options(parser, names="runtime name")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    kinds = runtimes()
    columns = [Col("runtime"), Col("runs on", gives_way=True), Col("command", drop=1),
               *(Col(c.value.replace("_", " ")) for c in Capability)]
    return listing(args, "runtimes", columns,
                   [[k.name, k.summary, k.command, *("yes" if c in k.capabilities else "-" for c in Capability)]
                    for k in kinds],
                   data=[{"name": k.name, "summary": k.summary, "command": k.command,
                          "capabilities": [c.value for c in Capability if c in k.capabilities]} for k in kinds],
                   names=(k.name for k in kinds))
