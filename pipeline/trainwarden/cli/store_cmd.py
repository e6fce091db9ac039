"""``trainwarden store migrate``: bring a history store's schema to this version;
``trainwarden store optimize``: merge its parts now.

Every reader and writer of a store migrates it on first use anyway; this
command does it on purpose (before a deployment, or for a ClickHouse server
that the services' user may not alter) and says where the schema stands.
"""

from __future__ import annotations

import argparse
import time

from trainwarden.cli.output import examples, out_console, print_json
from trainwarden.cli.stores import open_existing, store_target
from trainwarden.store import migrate, open_reader

COMMANDS = frozenset({"store"})
TAKES_COMMAND: frozenset = frozenset()


def add_commands(sub) -> None:
    store = sub.add_parser("store", help="manage the history store (schema migrations)",
                           **examples("trainwarden store migrate", "trainwarden store optimize --store DIR"))
    actions = store.add_subparsers(dest="store_action", metavar="ACTION", parser_class=sub._parser_class)
    actions.required = True
    run = actions.add_parser("migrate", help="apply the pending schema migrations and show the version",
                             description="The store is a directory (embedded chDB) or "
                                         "http(s)://user@host:port/database (password in "
                                         "$TRAINWARDEN_CLICKHOUSE_PASSWORD).",
                             **examples("trainwarden store migrate --store /var/lib/trainwarden/history",
                                        "TRAINWARDEN_CLICKHOUSE_PASSWORD=... trainwarden store migrate "
                                        "--store http://tw@clickhouse:8123/trainwarden --json"))
    run.add_argument("--store", help="history store directory or ClickHouse URL (default: $TRAINWARDEN_STORE or "
                                     "the per-user state directory)")
    run.add_argument("--json", action="store_true", help="JSON for machines")
    merge = actions.add_parser("optimize", help="merge the tables' parts now (OPTIMIZE ... FINAL), so that "
                                                "queries have no versions left to collapse",
                               **examples("trainwarden store optimize", "trainwarden store optimize --store DIR --json"))
    merge.add_argument("--store", help=run._option_string_actions["--store"].help)
    merge.add_argument("--json", action="store_true", help="JSON for machines")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    target = store_target(args)
    if args.store_action == "optimize":
        return _optimize(target, args)
    with open_reader(target) as reader:
        version = reader.current_version()
        applied = list(getattr(reader, "migrated", []))
    latest = max(m.version for m in migrate.load())
    if args.json:
        print_json({"store": target, "version": version, "latest": latest, "applied": applied})
        return 0
    names = {m.version: m.name for m in migrate.load()}
    if applied:
        for number in applied:
            out_console.print(f"applied {names.get(number, number)}", highlight=False)
    out_console.print(f"{target}: schema version {version} (this trainwarden's latest: {latest})"
                      + ("" if applied else "; nothing to apply"), highlight=False)
    return 0


def _optimize(target: str, args: argparse.Namespace) -> int:
    started = time.monotonic()
    with open_existing(target) as reader:
        tables = reader.optimize()
    elapsed = time.monotonic() - started
    if args.json:
        print_json({"store": target, "tables": tables, "seconds": round(elapsed, 3)})
    else:
        out_console.print(f"{target}: merged {len(tables)} tables in {elapsed:.1f} s", highlight=False)
    return 0
