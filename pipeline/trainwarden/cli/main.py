"""``trainwarden``: argument parsing and dispatch only.

Exit codes: 0 success (``run``: the job succeeded), 1 failure (``run``: the
job failed; ``rules test``: a test failed), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Optional, Sequence

from trainwarden.cli.completion import SHELLS, script
from trainwarden.cli.notify_cmd import add_notify_options
from trainwarden.cli.output import (ExamplesFormatter, UsageError, add_log_file_options, add_output_options,
                                    examples, fail)
from trainwarden.events import ErrorSource
from trainwarden.hardening import protect
from trainwarden.settings import SettingsError
from trainwarden.yamlsrc import ConfigError


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # No abbreviations: an ambiguous prefix of a password option would be
        # refused in an error that repeats its value.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one sentence and a hint, exit 2
        sys.exit(fail(f"{message}.", hint=f"see '{self.prog} --help'"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainwarden", description="Fault-tolerance engine for distributed training jobs.",
                     **examples('trainwarden run --nproc 2 --args "--enable-job-restart=True" -- python train.py',
                                "trainwarden history --aggregate --since 24h", "trainwarden COMMAND --help"))
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    run = sub.add_parser("run", help="run a job on this machine, watched and restarted by the rules",
                         description="trainwarden run JOB.yaml | trainwarden run [--nproc N] [--args ARGS] -- CMD ...",
                         **examples("trainwarden run examples/job.yaml",
                                    'trainwarden run --nproc 4 --args "--enable-job-restart=True '
                                    '--enable-job-hang-detection=True --job-hang-interval=600" -- python train.py',
                                    "trainwarden run job.yaml -o json --quiet > events.jsonl",
                                    "trainwarden run job.yaml --log-dir logs/ --store ~/tw-history", args_flags=True))
    run.add_argument("job_file", nargs="?", help="a job YAML file (or give the command after --)")
    run.add_argument("--job-id", help="the job's id (default: made from the command and the time)")
    run.add_argument("--nproc", type=int, default=1, help="instances of the command (role worker); default 1")
    run.add_argument("--args", default=None, help='the arguments string, e.g. "--enable-job-restart=True" (its flags are '
                                                      'listed below)')
    run.add_argument("--framework", default="pytorch", help="pytorch, mpi, tensorflow or elasticbatch")
    run.add_argument("--stop-grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL (default 10)")
    _store_option(run)
    run.add_argument("--rules", help="rules directory (default: the shipped rules)")
    run.add_argument("--quiet", action="store_true", help="do not echo the instances' output")
    run.add_argument("-o", "--output", choices=("text", "json"), default="text", metavar="FORMAT",
                     help="text: output lines and decisions for people (default); json: one JSON object per "
                          "line and event on standard output (instance started/exited, round, decision, "
                          "job finished)")
    run.add_argument("--log-dir", metavar="DIR", default=os.environ.get("TRAINWARDEN_LOG_DIR"),
                     help="also write each instance's output to DIR/JOB/INSTANCE/rROUND-sSTART.STREAM.log, as the "
                          "agents do (default: $TRAINWARDEN_LOG_DIR, else no files)")
    add_log_file_options(run)
    run.add_argument("--stack-tools", default=os.environ.get("TRAINWARDEN_STACK_TOOLS", "py-spy,pystack"),
                     help="tools for stack snapshots of a hung job, in order of preference (default py-spy,pystack;"
                          " 'none' to skip)")
    run.add_argument("--c4d-socket", metavar="PATH", default=os.environ.get("TRAINWARDEN_C4D_SOCKET"),
                     help="a Unix socket that C4D's collector writes its lines to: the trusted diagnostic channel "
                          "(a process of the job is refused) [env TRAINWARDEN_C4D_SOCKET]")
    run.add_argument("--c4d-log", default=os.environ.get("TRAINWARDEN_C4D_LOG"),
                     help="the C4D agent's log file, accepted only if the job's user cannot write it; else use "
                          "--c4d-socket [env TRAINWARDEN_C4D_LOG]")
    run.add_argument("--history-wait", metavar="SECONDS", default=os.environ.get("TRAINWARDEN_HISTORY_WAIT"),
                     help="at the end, how long to wait for room for history records that could not be written "
                          "(a full disk); then exit 1 naming how many were lost (default 60) "
                          "[env TRAINWARDEN_HISTORY_WAIT]")
    run.add_argument("--preload", metavar="MODULES", default=os.environ.get("TRAINWARDEN_PRELOAD"),
                     help="modules to import in a standby interpreter per instance, e.g. torch,numpy: every start "
                          "and restart of a Python instance takes a warm standby instead of a fresh interpreter "
                          "(adds to the job file's preload:) [env TRAINWARDEN_PRELOAD]")
    run.add_argument("--run-as", metavar="USER", default=os.environ.get("TRAINWARDEN_RUN_AS"),
                     help="start the instances as this user (a name or UID[:GID]), with its group and no other; "
                          "needs root [env TRAINWARDEN_RUN_AS]")
    run.add_argument("--stack-timeout", type=float, default=float(os.environ.get("TRAINWARDEN_STACK_TIMEOUT", 10)),
                     help="seconds one process's stack dump may take (default 10)")
    add_notify_options(run, drain=True)
    run.add_argument("--market", default=os.environ.get("TRAINWARDEN_MARKET"),
                     help="the spot market for a job with spot roles: a trace file or a registered provider URL")

    history = sub.add_parser(
        "history", help="fault records of one job or all jobs",
        description="Read the history store: fault records (default), aggregated fault details, jobs, restart "
                    "stages or spot costs. Exit code 2 for a store or a job that does not exist.",
        **examples("trainwarden history", "trainwarden history --job resnet-42 -o wide",
                   "trainwarden history --aggregate --since 24h --node gpu-node-7 --source hang",
                   "trainwarden history --jobs -o name", "trainwarden history --stages --json"))
    history.add_argument("--job", help="only this job")
    history.add_argument("--aggregate", action="store_true",
                         help="group by source, code, normalised message, node and instance")
    history.add_argument("--jobs", action="store_true", help="list jobs instead of fault records")
    history.add_argument("--stages", action="store_true", help="restart stage timings instead of fault records")
    history.add_argument("--wide", action="store_true", help="also show reason, rule and category")
    history.add_argument("--costs", action="store_true",
                         help="spot jobs: what each paid against on-demand, preemptions, time queued")
    history.add_argument("--spot", action="store_true",
                         help="spot jobs: every lifecycle step (queued, running, requeued, ...) with its cost so far")
    history.add_argument("--limit", type=_positive, default=None, help="at most this many rows (newest)")
    add_output_options(history, names="fault record id (--jobs: job id, --aggregate: error signature)",
                       wide="reason, rule, category; the same as --wide")
    history.add_argument("--since", type=_since, default=None,
                         help="only faults since a duration ago (90s, 15m, 24h, 7d) or a UTC time (2026-01-31T12:00)")
    history.add_argument("--node", help="only faults on this node")
    history.add_argument("--source", choices=[s.value for s in ErrorSource], help="only faults of this error source")
    _store_option(history)

    classify = sub.add_parser(
        "classify", help="the verdict the engine would reach for a failure (one or several instances' logs)",
        description="Judge a failure as the engine would: each FILE is one instance's log (a directory: every "
                    "file in it), all of them one job failure. The root cause decides; the others are its "
                    "consequences.",
        epilog="examples:\n  trainwarden classify worker-1.log --exit-code -9\n"
               "  trainwarden classify worker-0.log worker-1.log --exit-code 1 --exit-code 1 --explain\n"
               "  trainwarden classify logs/ --json\n\n"
               "A file may start with a '# exit_code: N' line (as in tests/data/failure_corpus).",
        formatter_class=ExamplesFormatter)
    classify.add_argument("files", nargs="+", metavar="FILE",
                          help="a log file, a directory of log files (one per instance), or - for standard input")
    classify.add_argument("--exit-code", type=_exit_code, action="append", default=None,
                          help="the exit code: once for every file, or once per file in order; a signal as "
                               "128+N or -N (default: the file's '# exit_code:' line, else 1)")
    classify.add_argument("--keyword", action="append", default=[],
                          help="a custom retryable keyword, as set_retryable_errors would add (repeatable)")
    classify.add_argument("--explain", action="store_true",
                          help="show every piece of evidence weighed, per instance and rank, and why the root won")
    classify.add_argument("--rules", help="rules directory (default: the shipped rules)")
    classify.add_argument("--json", action="store_true", help="JSON for machines")

    rules = sub.add_parser("rules", help="check and test rule files",
                           **examples("trainwarden rules validate rules/", "trainwarden rules test rules/tests"))
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=_Parser)
    rules_sub.required = True
    validate = rules_sub.add_parser(
        "validate", help="load rule files strictly, report every mistake, list the rules",
        description="Load the rule files as one rule pack, strictly: every mistake of every file is reported, "
                    "file:line each, and the exit code is 2 if there is any.",
        **examples("trainwarden rules validate", "trainwarden rules validate rules/",
                   "trainwarden rules validate rules/10-catalogue.yaml rules/50-site.yaml",
                   "trainwarden rules validate my-rules/ -o json"))
    validate.add_argument("paths", nargs="*", metavar="PATH",
                          help="rule files (read in the order given) or directories (their *.yaml in name order); "
                               "default: the shipped rules")
    add_output_options(validate, names="section/name")
    test = rules_sub.add_parser("test", help="run rule unit tests (YAML timelines)",
                                **examples("trainwarden rules test rules/tests",
                                           "trainwarden rules test --rules my-rules/ my-rules/tests/hang.yaml --json"))
    test.add_argument("files", nargs="+", help="test files or directories of them")
    test.add_argument("--rules", help="rules directory for every test file (default: each file's rule_files)")
    test.add_argument("--json", action="store_true", help="JSON for machines")

    completion = sub.add_parser(
        "completion", help="shell completion for bash, zsh or fish",
        description="Print a completion script for every command and option.",
        **examples("source <(trainwarden completion bash)      # in ~/.bashrc",
                         "source <(trainwarden completion zsh)       # in ~/.zshrc",
                         "trainwarden completion fish > ~/.config/fish/completions/trainwarden.fish"))
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")

    for module in _command_modules():
        module.add_commands(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainwarden")
    except PackageNotFoundError:
        return "(not installed as a package)"


# Modules that add commands: each has add_commands(subparsers), a COMMANDS set
# of the top-level names it adds, TAKES_COMMAND (those that accept a command
# after '--'), and dispatch(args, command) -> exit code.

COMMAND_MODULES = (
    "trainwarden.cli.cluster_cmd",
    "trainwarden.cli.diagnose_cmd",
    "trainwarden.cli.store_cmd",
    "trainwarden.cli.report_cmd",
    "trainwarden.cli.notify_cmd",
    "trainwarden.cli.spot_cmd",
    "trainwarden.cli.market_cmd",
    "trainwarden.cli.runtimes_cmd",
)


# The long-lived processes that hold the signing key (and a broker password):
# not dumpable, and no secret left in their environment (hardening.py).
PROTECTED_COMMANDS = frozenset({"agent", "processor", "actuator", "notifier", "market", "run"})


def _command_modules():
    import importlib

    return [importlib.import_module(name) for name in COMMAND_MODULES]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


class _Since(float):
    """--since in seconds ago, remembering how it was given (to echo it back)."""

    text: str

    def __new__(cls, seconds: float, text: str):
        value = super().__new__(cls, seconds)
        value.text = text
        return value


def _since(text: str) -> float:
    from trainwarden.store.analytics import since_seconds

    try:
        return _Since(since_seconds(text), text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not -255 <= value <= 255:
        raise argparse.ArgumentTypeError(f"an exit code is from -255 to 255 (-N: killed by signal N), not {value}")
    return value


def _raise_open_file_limit() -> None:
    """Every instance takes pipes and sockets; a large job would otherwise hit
    the soft limit (often 1024) and fail to start instances through no fault of theirs."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="history store directory (default: $TRAINWARDEN_STORE or the "
                                        "per-user state directory)")


def _join_args_value(argv: list[str]) -> list[str]:
    """``--args "--enable-job-restart=True"``: argparse would take the value for
    an option of its own, so join it as ``--args=...``."""
    joined: list[str] = []
    index = 0
    while index < len(argv):
        if argv[index] == "--args" and index + 1 < len(argv):
            joined.append("--args=" + argv[index + 1])
            index += 2
            continue
        joined.append(argv[index])
        index += 1
    return joined


def main(argv: Optional[Sequence[str]] = None) -> int:
    own_command_line = argv is None  # not called inside another program (a test runner)
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    if not argv and not command:
        build_parser().print_help()  # a bare `trainwarden`: what it can do, not an error
        return 0
    args = build_parser().parse_args(_join_args_value(argv))
    _raise_open_file_limit()
    # SIGTERM and SIGHUP (the terminal closed) end a run like Ctrl-C does:
    # instances are stopped and the history is written.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    try:
        if own_command_line and args.command in PROTECTED_COMMANDS:
            # It may start itself again without the secret variables (hardening.py).
            protect()
        return _dispatch(args, command)
    except SettingsError as exc:
        return fail(str(exc), exc.hint or "'trainwarden run --help' lists every flag of --args with its default")
    except ConfigError as exc:
        return fail(str(exc), exc.hint)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a user sees one sentence, not a traceback
        if os.environ.get("TRAINWARDEN_DEBUG"):
            raise
        return fail(f"internal error: {exc!r}", hint="this is a bug; rerun with TRAINWARDEN_DEBUG=1 for the "
                    "traceback and report it", code=1)


def _dispatch(args: argparse.Namespace, command: list[str]) -> int:
    from trainwarden.store import StoreError
    from trainwarden.store.base import StoreMissing

    try:
        if args.command == "run":
            from trainwarden.cli.run_cmd import cmd_run

            return cmd_run(args, command)
        for module in _command_modules():
            if args.command in module.COMMANDS:
                if command and args.command not in module.TAKES_COMMAND:
                    return fail(f"'{args.command}' takes no command after '--'")
                return module.dispatch(args, command)
        if command:
            return fail(f"'{args.command}' takes no command after '--'")
        if args.command == "history":
            from trainwarden.cli.history_cmd import cmd_history

            return cmd_history(args)
        if args.command == "completion":
            sys.stdout.write(script(build_parser(), args.shell))
            return 0
        if args.command == "classify":
            from trainwarden.cli.classify_cmd import cmd_classify

            return cmd_classify(args)
        from trainwarden.cli import rules_cmd

        if args.rules_command == "validate":
            return rules_cmd.cmd_validate(args)
        return rules_cmd.cmd_test(args)
    except UsageError as exc:
        return fail(str(exc), exc.hint)
    except StoreError as exc:
        # A store that is not there was named wrong: a usage error, as a job that is not there.
        return fail(str(exc), getattr(exc, "hint", ""), code=2 if isinstance(exc, StoreMissing) else 1)


if __name__ == "__main__":
    sys.exit(main())
