"""``trainwarden runtimes``: where jobs can run and what each runtime can do."""

from __future__ import annotations

import argparse

from trainwarden.cli.output import print_json, table
from trainwarden.runtime.base import Capability
from trainwarden.runtime.registry import runtimes

COMMANDS = {"runtimes"}
TAKES_COMMAND: set = set()


def add_commands(sub) -> None:
    parser = sub.add_parser("runtimes", help="the runtimes jobs can run on, and what each can do")
    parser.add_argument("--json", action="store_true")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    kinds = runtimes()
    if args.json:
        print_json([{"name": k.name, "summary": k.summary, "command": k.command,
                     "capabilities": [c.value for c in Capability if c in k.capabilities]} for k in kinds])
        return 0
    table("runtimes", ["runtime", "runs on", "command", *(c.value.replace("_", " ") for c in Capability)],
          [[k.name, k.summary, k.command, *("yes" if c in k.capabilities else "-" for c in Capability)]
           for k in kinds], wide=["runs on"])
    return 0
