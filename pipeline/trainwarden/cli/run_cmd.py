"""``trainwarden run``: a job file or a command, on this machine."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

from trainwarden.cli.jsonlines import JsonReporter
from trainwarden.cli.output import ConsoleReporter, fail, plural, print_outcome
from trainwarden.cli.stores import store_target
from trainwarden.cli.notify_cmd import notify_options
from trainwarden.diagnose.collect import tool_order
from trainwarden.events import Reason
from trainwarden.jobspec import from_command, load_job_file, parse_preload
from trainwarden.notify.queue import QueueError
from trainwarden.rules.loader import load_rules
from trainwarden.runtime.c4d_source import C4DChannelError, c4d_flags_problem
from trainwarden.runtime.run_as import RunAsError
from trainwarden.runtime.run_as import resolve as resolve_run_as
from trainwarden.runtime.logfiles import limits_from_flags
from trainwarden.services.embedded import HISTORY_WAIT_S, EmbeddedRun
from trainwarden.spot.market import open_market
from trainwarden.spot.spec import check_bids
from trainwarden.store import StoreError, open_reader, open_writer
from trainwarden.yamlsrc import ConfigError


def cmd_run(args: argparse.Namespace, command: list[str]) -> int:
    if args.job_file and command:
        return fail("give either a job file or a command after '--', not both")
    if args.job_file:
        for flag, value in (("--nproc", args.nproc != 1), ("--args", args.args is not None)):
            if value:
                return fail(f"{flag} goes with a command after '--'; a job file sets it itself",
                            hint="edit the job file instead")
        job = load_job_file(args.job_file, job_id=args.job_id)
    else:
        job = from_command(command, args.nproc, args.args or "", args.job_id, args.framework)
    if args.stop_grace is not None:
        if not 0 <= args.stop_grace <= 3600:
            return fail("--stop-grace must be from 0 to 3600 seconds")
        job = dataclasses.replace(job, stop_grace_s=args.stop_grace)
    if args.preload:
        job = job.with_preload(parse_preload(args.preload))
    market, bids = None, ()
    if job.spot and not args.market:
        return fail(f"the job has spot roles ({', '.join(b.role for b in job.spot)}) but no market",
                    hint="give --market TRACE (a market trace file) or a registered provider URL")
    if args.market and not job.spot:
        return fail("--market is for jobs with spot roles", hint="add a 'spot' section to a role of the job file")
    if job.spot:
        market = open_market(args.market)
        bids = check_bids(job.spot, market)
    pack = load_rules(args.rules)
    try:
        notify = notify_options(args, job.job_id)
    except ConfigError:
        raise  # names file and line; main prints it
    except ValueError as exc:
        return fail(str(exc))
    # The C4D channel: --c4d-socket (or $TRAINWARDEN_C4D_SOCKET), else a --c4d-log no job can write.
    c4d_flags = {"c4d_log": args.c4d_log,
                 "c4d_socket": getattr(args, "c4d_socket", None) or os.environ.get("TRAINWARDEN_C4D_SOCKET")}
    refused = c4d_flags_problem(c4d_flags["c4d_log"], c4d_flags["c4d_socket"])
    if refused:
        return fail(*refused)
    try:
        run_as = resolve_run_as(args.run_as) if getattr(args, "run_as", None) else None
    except RunAsError as exc:
        return fail(str(exc), hint=exc.hint)
    store_dir = store_target(args)
    log_dir = _log_dir(args.log_dir)
    if isinstance(log_dir, int):
        return log_dir
    log_limits, problem = limits_from_flags(args.log_file_max_mb, args.log_files_kept)
    if log_limits is None:
        return fail(problem, hint="for example --log-file-max-mb 64 --log-files-kept 2")
    writer = open_writer(store_dir)
    as_json = args.output == "json"
    reporter = JsonReporter(quiet_output=args.quiet) if as_json else ConsoleReporter(quiet_output=args.quiet)
    if as_json:
        reporter.emit("job_started", job_id=job.job_id, instances=[i.name for i in job.instances()],
                      store=store_dir, log_dir=log_dir)
    else:
        reporter.info(f"job {job.job_id}: {plural(len(job.instances()), 'instance')}, history in {store_dir}"
                      + (f", output files in {log_dir}" if log_dir else ""))
    try:
        tools = () if args.stack_tools.strip().lower() == "none" else tool_order(args.stack_tools)
    except ValueError as exc:
        return fail(f"--stack-tools: {exc}", hint="for example --stack-tools=pystack,py-spy or --stack-tools=none")
    if not 0.5 <= args.stack_timeout <= 300:
        return fail("--stack-timeout must be from 0.5 to 300 seconds")
    history_wait = _history_wait(args.history_wait)
    if isinstance(history_wait, int):
        return history_wait
    try:
        result = EmbeddedRun(job, pack, writer, reporter, stack_tools=tools, stack_timeout_s=args.stack_timeout,
                             **c4d_flags, notify=notify, market=market, spot=bids, log_dir=log_dir,
                             log_limits=log_limits, history_wait_s=history_wait, run_as=run_as).run()
    except QueueError as exc:
        return fail(str(exc), hint="give this run its own --notify-dir, or wait for the other one to finish")
    except C4DChannelError as exc:
        return fail(str(exc), hint="give a --c4d-socket path in a directory this user can write")
    _compact(store_dir)
    if as_json:
        reporter.emit("job_finished", job_id=result.job_id, status=result.status.value, reason=result.reason,
                      restarts=result.rounds, exit_code=result.exit_code, dead_letters=result.dead_letters,
                      counters=result.counters, lost_records=result.lost_records)
        reporter.flush()
        return result.exit_code
    extra = f", {plural(result.dead_letters, 'dead letter')}" if result.dead_letters else ""
    for key, noun, after in (("truncated_lines", "line", " cut at 16 KiB"),
                             ("non_utf8_lines", "line", " with invalid UTF-8"),
                             ("stale_lines_dropped", "line", " of stopped instances dropped"),
                             ("escaped_processes_killed", "escaped child process", " killed")):
        if result.counters.get(key):
            extra += f", {plural(result.counters[key], noun, after)}"
    if result.lost_records:
        extra += f", {plural(result.lost_records, 'history record')} lost"
    print_outcome(result.job_id, result.status.value, result.reason or "", result.rounds, extra=extra,
                  history=f"trainwarden history --job {result.job_id}" + (f" --store {store_dir}" if args.store else ""))
    return result.exit_code


def _log_dir(raw: str | None) -> str | None | int:
    """The output files' directory, made now: a wrong one is a usage error before anything starts."""
    if not raw:
        return None
    path = Path(raw).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return fail(f"--log-dir {raw}: cannot create it ({exc.strerror})", hint="give a writable directory")
    if not os.access(path, os.W_OK):
        return fail(f"--log-dir {raw}: not writable", hint="give a writable directory")
    return str(path)


def _history_wait(raw: str | None) -> float | int:
    """Seconds a finished run waits for room for history records it could not write."""
    if raw is None or not raw.strip():
        return HISTORY_WAIT_S
    text = raw.strip()
    seconds = float(text) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else -1.0
    if not 0 <= seconds <= 86400:
        return fail(f"--history-wait {raw!r} is not a number of seconds from 0 to 86400",
                    hint=f"for example --history-wait 300 (or TRAINWARDEN_HISTORY_WAIT=300); {HISTORY_WAIT_S:g} s "
                         f"when not given")
    return seconds


def _compact(store_dir: str) -> None:
    """Move this run's spooled records into the database now, if nobody else
    holds the store; otherwise the next reader does it."""
    try:
        with open_reader(store_dir, wait_s=2.0):
            pass  # opening ingests the spool
    except (StoreError, OSError):
        pass  # a full disk, say: the records stay in the spool, and the run has said what it could not write
