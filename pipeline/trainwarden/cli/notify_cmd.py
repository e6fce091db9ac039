"""``trainwarden notify``: validate subscriptions, send a test event, read the
delivery log. Parsing and printing only; the work is in trainwarden.notify."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import msgspec

from trainwarden.cli.output import (
    add_output_options,
    err_console,
    examples,
    fail,
    iso,
    listing,
    out_console,
    print_json,
)
from trainwarden.cli.tables import Col, time_col
from trainwarden.cli.stores import job_known, no_such_job, open_existing, store_target
from trainwarden.notify import (
    EVENT_TYPES,
    default_directory,
    load_subscriptions,
    missing_env,
    read_delivery_log,
    sample_event,
    shipped_notifications_dir,
)
from trainwarden.notify.bridge import NotifyOptions
from trainwarden.notify.notifier import Notifier
from trainwarden.notify.queue import QueueError
from trainwarden.notify.safety import redact
from trainwarden.store import open_writer
from trainwarden.store.queries import deliveries
from trainwarden.notify.transport import send_once

COMMANDS = frozenset({"notify"})
TAKES_COMMAND: frozenset = frozenset()
SHOWN_RESPONSE = 2048  # bytes of the receiver's answer printed (64 KiB are read)


def add_notify_options(parser, drain: bool = False) -> None:
    """The notification options of ``run`` and ``notifier``."""
    parser.add_argument("--notifications", metavar="DIR", default=os.environ.get("TRAINWARDEN_NOTIFICATIONS"),
                        help="subscriptions directory (e.g. rules/notifications); notifications are off without it")
    parser.add_argument("--notify-dir", metavar="DIR",
                        help="the durable delivery queue (default: $TRAINWARDEN_NOTIFY_DIR or the per-user state "
                             "directory; `run` adds the job id)")
    if drain:
        parser.add_argument("--notify-drain", type=float, default=30.0, metavar="S",
                            help="at the end of the run, seconds to wait for pending deliveries (default 30)")


def notify_options(args: argparse.Namespace, job_id: str = "") -> "NotifyOptions | None":
    """Parsed notification options, or None when notifications are off.
    Raises ConfigError (file:line) for invalid subscriptions."""
    if not args.notifications:
        return None
    drain = getattr(args, "notify_drain", 30.0)
    if not 0 <= drain <= 3600:
        raise ValueError("--notify-drain must be from 0 to 3600 seconds")
    subs = load_subscriptions(Path(args.notifications))
    if args.notify_dir:
        directory = Path(args.notify_dir).expanduser()
    else:
        directory = default_directory() / "runs" / job_id if job_id else default_directory()
    return NotifyOptions(subscriptions=subs, directory=directory, drain_s=drain)


def add_commands(sub) -> None:
    notify = sub.add_parser("notify", help="webhook notifications: check subscriptions, send a test, read the log",
                            **examples("trainwarden notify validate rules/notifications",
                                       "trainwarden notify log --job resnet-42"))
    actions = notify.add_subparsers(dest="notify_command", metavar="ACTION", parser_class=type(notify))
    actions.required = True
    validate = actions.add_parser("validate", help="load a subscriptions directory strictly and list it",
                                  **examples("trainwarden notify validate", "trainwarden notify validate "
                                             "rules/notifications -o name"))
    validate.add_argument("directory", nargs="?", help="subscriptions directory (default: the shipped examples)")
    add_output_options(validate, names="subscription name")
    test = actions.add_parser("test", help="send a sample event to one subscription and print the answer",
                              **examples("trainwarden notify test ops-webhook --dir rules/notifications",
                                         "trainwarden notify test ml-oncall-slack --type job.failed --json"))
    test.add_argument("name", help="the subscription's name")
    test.add_argument("--dir", help="subscriptions directory (default: the shipped examples)")
    test.add_argument("--type", dest="event_type", help="the sample's event type (default: the first the "
                                                        "subscription receives)")
    test.add_argument("--json", action="store_true", help="JSON for machines")
    log = actions.add_parser("log", help="deliveries: status, attempts, HTTP status, latency",
                             description="Reads the delivery log from the history store (the deliveries table); "
                                         "with --notify-dir, the JSONL log of a notifier that runs without a store.",
                             **examples("trainwarden notify log --job resnet-42", "trainwarden notify log --limit 20 "
                                        "-o json", "trainwarden notify log --notify-dir /var/lib/trainwarden/notify"))
    log.add_argument("--job", help="only this job")
    log.add_argument("--limit", type=int, default=None, help="at most this many rows (newest)")
    log.add_argument("--store", help="history store (default: $TRAINWARDEN_STORE or the per-user state directory)")
    log.add_argument("--notify-dir", help="read this notifier directory's deliveries.jsonl instead of the store")
    add_output_options(log)
    flush = actions.add_parser("flush", help="send what a stopped notifier left queued in its directory",
                               description="Delivers the pending deliveries of a queue directory (e.g. one a run "
                                           "left behind) with the given subscriptions, then stops.",
                               **examples("trainwarden notify flush ~/.local/state/trainwarden/notify/runs/JOB "
                                          "--notifications rules/notifications"))
    flush.add_argument("notify_dir", help="the queue directory")
    flush.add_argument("--notifications", metavar="DIR", required=True, help="subscriptions directory")
    flush.add_argument("--store", help="history store for the delivery log (default: $TRAINWARDEN_STORE or the "
                                       "per-user state directory)")
    flush.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying (default 60)")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    if args.notify_command == "validate":
        return _validate(args)
    if args.notify_command == "test":
        return _test(args)
    if args.notify_command == "flush":
        return _flush(args)
    return _log(args)


def _validate(args: argparse.Namespace) -> int:
    directory = Path(args.directory) if args.directory else shipped_notifications_dir()
    subs = load_subscriptions(directory)
    missing = [(s.name, name) for s, name in missing_env(subs, os.environ)]
    data = {"valid": True, "files": list(subs.files), "subscriptions": [
            {"name": s.name, "enabled": s.enabled, "events": list(s.events), "jobs": list(s.jobs),
             "min_severity": s.min_severity.value, "receives": s.event_types(), "method": s.target.method,
             "url": s.target.shown_url(), "signed": bool(s.secret), "body": _body(s),
             "rate_limit_s": s.rate_limit_s, "max_attempts": s.retry.max_attempts, "origin": s.origin}
            for s in subs], "missing_env": [{"subscription": s, "variable": v} for s, v in missing]}
    rows = [(s.name, "yes" if s.enabled else "no", _cut(", ".join(s.events), 40), _cut(", ".join(s.jobs), 20),
             s.min_severity.value, s.target.shown_url(), _body(s),
             f"{s.rate_limit_s:g} s" if s.rate_limit_s else "off", _where(s.origin)) for s in subs]
    listing(args, f"{directory}: {len(subs.files)} files, {len(subs)} subscriptions, valid",
            [Col("name"), Col("on"), Col("events", drop=3), Col("jobs", drop=2), Col("severity", drop=1),
             Col("target", gives_way=True), Col("body"), Col("limit", drop=4), Col("where", drop=5)], rows,
            data=data, names=(s.name for s in subs))
    for name, variable in missing:
        err_console.print(f"warning: subscription {name} needs ${variable}, which is not set here",
                          markup=False, highlight=False)
    return 0


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _where(origin: str) -> str:
    path, _, line = origin.rpartition(":")
    return f"{Path(path).name}:{line}"


def _body(sub) -> str:
    what = sub.template.what  # "template 'slack'" or "inline body of 'ops'"
    return what.split("'")[1] if what.startswith("template '") else "inline"


def _test(args: argparse.Namespace) -> int:
    directory = Path(args.dir) if args.dir else shipped_notifications_dir()
    subs = load_subscriptions(directory)
    sub = subs.get(args.name)
    if sub is None:
        return fail(f"no subscription named '{args.name}' in {directory}",
                    hint="known: " + (", ".join(s.name for s in subs) or "none"))
    event_type = args.event_type or (sub.event_types() or ["job.failed"])[0]
    if event_type not in EVENT_TYPES:
        return fail(f"unknown event type '{event_type}'", hint="event types: " + ", ".join(EVENT_TYPES))
    unset = [name for name in sub.env_vars() if name not in os.environ]
    if unset:
        return fail(f"subscription {sub.name} needs ${unset[0]}, which is not set",
                    hint="export " + ", ".join(unset) + " first (secrets come from the environment)")
    if not sub.enabled:
        err_console.print(f"note: {sub.name} is switched off (enabled: false); sending the test anyway")
    # A fresh id each time: a receiver that dedupes by webhook-id still shows every test.
    event = sample_event(event_type, job_id="trainwarden-notify-test", time=time.time(),
                         source_id=f"notify-test-{time.time_ns()}")
    body = sub.template.render(event.payload(), sub.name)
    result, secrets = send_once(sub, event.id, body.encode(), env=os.environ)
    text = redact(result.body.decode("utf-8", errors="replace"), secrets)  # masked whole, then cut
    shown = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text[:SHOWN_RESPONSE])
    error = redact(result.error, secrets)
    ok = result.outcome == "delivered"
    if args.json:
        print_json({"subscription": sub.name, "event_type": event_type, "webhook_id": event.id,
                    "outcome": result.outcome, "http_status": result.http_status, "latency_ms": result.latency_ms,
                    "error": error, "response": shown})
        return 0 if ok else 1
    status = f"HTTP {result.http_status}" if result.http_status else "no HTTP answer"
    colour = "green" if ok else "red"
    out_console.print(f"[{colour}]{status}[/] from {sub.target.method} {sub.target.shown_url()} in "
                      f"{result.latency_ms:g} ms ({event_type}, webhook-id {event.id})", highlight=False)
    if error and not result.http_status:  # with an answer, the answer itself says it
        out_console.print(f"  {error}", markup=False, highlight=False)
    if shown:
        more = " (cut)" if len(result.body) > SHOWN_RESPONSE else ""
        out_console.print(f"response{more}:", highlight=False)
        out_console.print(shown, markup=False, highlight=False)
    return 0 if ok else 1


def _store_dir(args: argparse.Namespace) -> str:
    return store_target(args)


def _log(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        return fail("--limit must be 0 or more")
    if args.notify_dir:
        where = Path(args.notify_dir).expanduser() / "deliveries.jsonl"
        rows = [msgspec.structs.asdict(r) for r in read_delivery_log(where, args.job, args.limit)]
    else:
        where = _store_dir(args)
        with open_existing(where) as reader:
            rows = deliveries(reader, job_id=args.job, limit=args.limit)
            if args.job and not rows and not job_known(reader, args.job):
                return no_such_job(where, args.job)
    title = f"deliveries{' of ' + args.job if args.job else ''} ({where})"
    return listing(args, title, [time_col("time"), Col("job"), Col("event", drop=2), Col("subscription"),
                                 Col("status"), Col("attempts"), Col("http", drop=3), Col("latency ms", drop=1),
                                 Col("error", gives_way=True)],
                   [(iso(r["time"]), r["job_id"], r["event_type"], r["subscription"], r["status"], r["attempts"],
                     r["http_status"] or "", f"{r['latency_ms']:g}" if r["latency_ms"] else "", r["error"])
                    for r in rows], data=rows)


def _flush(args: argparse.Namespace) -> int:
    if not 0 < args.timeout <= 86400:
        return fail("--timeout must be from 0 to 86400 seconds")
    subs = load_subscriptions(Path(args.notifications))
    directory = Path(args.notify_dir).expanduser()
    if not (directory / "pending").is_dir():
        return fail(f"{directory} is not a notifier queue directory", hint="give the directory a run printed")
    try:
        notifier = Notifier(subs, directory, writer=open_writer(_store_dir(args)))
    except QueueError as exc:
        return fail(str(exc), hint="wait for that notifier to stop")
    before = notifier.pending()
    notifier.start()
    done = notifier.drain(args.timeout, release_held=True)
    left = notifier.pending()
    stats = notifier.stats()
    notifier.close()
    out_console.print(f"{before - left} of {before} pending deliveries finished "
                      f"({stats.get('delivered', 0)} delivered, {stats.get('dead', 0)} dead); {left} left",
                      highlight=False)
    return 0 if done else 1
