"""The distributed shape's commands: kafka init, agent, processor, actuator,
notifier, submit, nodes. Parsing and printing only; the work is in
trainwarden.services (services/runner.py runs a service as a process).

Every option has an environment variable, TRAINWARDEN_<FLAG> unless noted,
named in its help."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

from trainwarden.bus import ACTUATOR_STATE, NODES, BusError, kafka_security, open_bus, topic_specs
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import Heartbeat, NodeState
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.cli.notify_cmd import add_notify_options, notify_options
from trainwarden.cli.output import (ConsoleReporter, add_log_file_options, add_output_options, err_console, examples,
                                    fail, iso, listing)
from trainwarden.cli.stores import store_target
from trainwarden.clock import now as clock_now
from trainwarden.events import DecisionKind
from trainwarden.jobspec import from_command, load_job_file, parse_preload
from trainwarden.runtime import registry
from trainwarden.rules.loader import load_rules
from trainwarden.services.logs import FORMATS as LOG_FORMATS
from trainwarden.services.observability import (
    ObservedDeliveries,
    directory_writable,
    parse_address,
    store_writable,
)
from trainwarden.services.runner import Reload, ServiceRun
from trainwarden.store import default_store_dir, open_writer

COMMANDS = frozenset({"kafka", "agent", "processor", "actuator", "notifier", "submit", "nodes"})
TAKES_COMMAND = frozenset({"submit"})
# Seconds a stopping notifier still delivers what is due; well inside the 5 s
# a service has to stop after SIGTERM.
STOP_DRAIN_S = 1.0


def add_commands(sub) -> None:
    kafka = sub.add_parser("kafka", help="Kafka topics for the distributed services")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", metavar="ACTION")
    kafka_sub.required = True
    init = kafka_sub.add_parser("init", help="create the topics (idempotent)", **examples(
        "trainwarden kafka init --partitions 8 --bootstrap kafka:9092"))
    _option(init, "--partitions", type=int, default=8, help="partitions of the job topics (default 8)")
    _bootstrap(init)

    agent = sub.add_parser("agent", help="run the node agent: starts instances placed on this node", **examples(
        "trainwarden agent --node gpu-7 --slots 8 --bootstrap kafka:9092",
        "TRAINWARDEN_NODE=gpu-7 trainwarden agent --metrics-address 0.0.0.0:9464 --log-format json",
        *registry.examples(registry.AGENT)))
    _option(agent, "--node", default=socket.gethostname(), help="this node's name (default: the host name)")
    _option(agent, "--slots", type=int, default=8, help="instances this node can run at once (default 8)")
    _option(agent, "--log-dir", help="where instance output files go, for Vector (default: agent-NODE/logs next "
                                     "to the default store)")
    _option(agent, "--address", default="", help="address other nodes reach this one at (MASTER_ADDR; default: "
                                                  "what the host name resolves to)")
    _option(agent, "--c4d-socket", help="a Unix socket C4D's collector writes its findings to (the trusted "
                                        "diagnostic channel; a connection from an instance's process is refused)")
    _option(agent, "--c4d-log", help="C4D's log file on this node, if the instances' user cannot write it "
                                     "(else refused: use --c4d-socket)")
    _option(agent, "--readopt-grace", type=float, default=8.0, metavar="SECONDS",
            help="how long the instances outlive a killed or crashed agent, for its next run to take them back "
                 "(default 8: ended before the actuator's --node-timeout, 10, counted from the last heartbeat, "
                 "restarts their job elsewhere; 0: they end with it)")
    _runtime_options(agent, registry.AGENT)
    _switch(agent, "--no-ship-logs", help="write output files only, for Vector to ship (lines would otherwise "
                                          "arrive twice)")
    _option(agent, "--run-as", metavar="USER",
            help="start the instances as this user (a name or UID[:GID]), with its group and no other: a job "
                 "must not run as the agent's user, who can read the signing key (the agent runs as root)")
    add_log_file_options(agent)
    _service_options(agent)

    processor = sub.add_parser("processor", help="run the stream processor: the engine over Kafka", **examples(
        "trainwarden processor --rules /etc/trainwarden/rules --bootstrap kafka:9092",
        "trainwarden processor --metrics-address 0.0.0.0:9464      # then: kill -HUP PID reloads the rules"))
    _option(processor, "--rules", help="rules directory (default: the shipped rules); SIGHUP reloads it")
    _switch(processor, "--accept-unsigned-logs",
            help="with a signing key, also take unsigned log lines (Vector ships the agents' files unsigned); a "
                 "line still counts only for an instance that runs on the node it names")
    _service_options(processor)

    actuator = sub.add_parser("actuator", help="run the actuator: places instances, executes decisions",
                              **examples("trainwarden actuator --store /var/lib/trainwarden/history",
                                          "trainwarden actuator --store http://trainwarden@clickhouse:8123/trainwarden",
                                          *registry.examples(registry.ACTUATOR)))
    _option(actuator, "--store", help="history store: a directory (chDB) or http(s)://user@host:port/db (default: "
                                      "the per-user state directory)")
    _runtime_options(actuator, registry.ACTUATOR)
    _option(actuator, "--run-as", metavar="USER",
            help=f"with {' or '.join(registry.run_as_flags())}: submit the jobs of that runtime as this user (a name or "
                 "UID[:GID]; the actuator runs as root), so their tasks cannot read the services' keys")
    _option(actuator, "--node-timeout", type=float, default=10.0,
            help="seconds without a heartbeat before a node is lost (default 10)")
    _service_options(actuator)

    notifier = sub.add_parser("notifier", help="run the notifier: decisions as signed webhook events",
                              description="Reads the decisions topic in its own group and delivers the events to "
                                          "the subscriptions (docs/EVENTS.md); the delivery log goes to the store.",
                              **examples("trainwarden notifier --notifications rules/notifications --store "
                                          "/var/lib/trainwarden/history",
                                          "TRAINWARDEN_NOTIFICATIONS=/etc/trainwarden/notifications trainwarden "
                                          "notifier --metrics-address :9464 --log-format json",
                                          "kill -HUP PID       # reloads the subscriptions; invalid ones are "
                                          "refused with file:line"))
    add_notify_options(notifier)
    for flag in ("--notifications", "--notify-dir"):
        _env_of(notifier, flag)
    _option(notifier, "--store", help="history store for the delivery log: a directory (chDB) or "
                                      "http(s)://user@host:port/db")
    _option(notifier, "--max-age", type=float, default=3600.0,
            help="decisions older than this many seconds when first read are not announced (default 3600)")
    _service_options(notifier)

    submit = sub.add_parser("submit", help="submit a job to the cluster",
                            description="trainwarden submit JOB.yaml | trainwarden submit [--nproc N] -- CMD ... "
                                        "The command runs in the directory you submit from (a job file's: in its "
                                        "workdir:, by default the job file's directory), on every node it is "
                                        "placed on, as sbatch does: that directory must be there too.",
                            **examples("trainwarden submit examples/job.yaml --follow",
                                        "trainwarden submit --nproc 4 --args \"--enable-job-restart=True\" -- "
                                        "python train.py",
                                        "trainwarden submit job.yaml --follow --json | jq -c 'select(.event == "
                                        "\"decision\")'",
                                        *registry.examples("submit"), args_flags=True))
    submit.add_argument("job_file", nargs="?", help="a job YAML file (or give the command after --)")
    # Not TRAINWARDEN_JOB_ID: every instance has that one, and a job that submits a job would reuse its own id.
    _option(submit, "--job-id", env="TRAINWARDEN_SUBMIT_JOB_ID",
            help="the job's id (default: the job file's, else made from the command and the time)")
    _option(submit, "--nproc", type=int, default=1, help="instances of the command (role worker); default 1")
    _option(submit, "--args", help='the arguments string, e.g. "--enable-job-restart=True" (its flags are listed below)')
    _option(submit, "--framework", default="pytorch", help="pytorch, mpi, tensorflow or elasticbatch (default "
                                                           "pytorch)")
    kinds = registry.submitted()
    _option(submit, "--runtime", default=registry.FALLBACK.name, type=_choice(*(k.name for k in kinds)),
            help=f"where the cluster runs it: {', '.join(k.name for k in kinds)} (default "
                 f"{registry.FALLBACK.name}; trainwarden runtimes says what each is)")
    _option(submit, "--preload", metavar="MODULES",
            help="modules the agents' standby interpreters import for the job, e.g. torch,numpy: a restart takes "
                 "a warm interpreter instead of a fresh one (adds to the job file's preload:)")
    _option(submit, "--market", help="a job with spot roles: the market its bids are checked against, the one the "
                                     "cluster's market service polls (a trace file or a registered provider's URL)")
    _switch(submit, "--follow", help="stream output and exit 0/1 with the outcome")
    _switch(submit, "--quiet", help="with --follow: decisions only")
    # As `run -o json`: JSON lines of events. --json is the same (as for every other command).
    _option(submit, "-o", "--output", type=_choice("text", "json"), metavar="FORMAT",
            help="text: output lines and decisions for people (default); json: one JSON object per line on stdout, "
                 "the submission and with --follow every output line and decision")
    _switch(submit, "--json", help="the same as -o json")
    _bootstrap(submit)
    _signing_options(submit)

    nodes = sub.add_parser("nodes", help="list nodes; isolate or uncordon one", **examples(
        "trainwarden nodes", "trainwarden nodes -o json", "trainwarden nodes -o name --listen 5",
        "trainwarden nodes isolate gpu-7",
        "trainwarden nodes uncordon gpu-7"))
    nodes.add_argument("action", nargs="?", choices=("list", "isolate", "uncordon"), default="list",
                       help="list (the default), isolate (no new instances there) or uncordon (ready again)")
    nodes.add_argument("name", nargs="?", help="the node to isolate or uncordon: one the cluster knows")
    add_output_options(nodes, names="node name")
    for flag in ("--output", "--json", "--no-headers"):
        _env_of(nodes, flag)
    _option(nodes, "--listen", type=float, default=2.5, help="seconds to listen for heartbeats (default 2.5)")
    _bootstrap(nodes)
    _signing_options(nodes)


# Switches (store_true) whose environment variable is read at dispatch, where a bad value can be refused.
_SWITCHES: dict[str, str] = {}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _env_name(flag: str) -> str:
    return "TRAINWARDEN_" + flag.lstrip("-").upper().replace("-", "_")


def _option(parser: argparse.ArgumentParser, *flags: str, env: str = "", default=None, help: str, **kwargs) -> None:
    """An option whose default comes from an environment variable (argparse
    converts and checks it like a value given on the command line)."""
    env = env or _env_name(flags[-1])
    value = os.environ.get(env)
    parser.add_argument(*flags, default=value if value else default, help=f"{help} [env {env}]", **kwargs)


def _switch(parser: argparse.ArgumentParser, flag: str, *, help: str) -> None:
    env = _env_name(flag)
    action = parser.add_argument(flag, action="store_true", default=None, help=f"{help} [env {env}=1]")
    _SWITCHES[action.dest] = env


def _env_of(parser: argparse.ArgumentParser, flag: str) -> None:
    """An option another module defines (shared with other commands) gets its
    environment variable here, as those of _option and _switch do."""
    action = parser._option_string_actions[flag]
    env = _env_name(flag)
    if isinstance(action, argparse._StoreTrueAction):
        action.default = None
        _SWITCHES[action.dest] = env
        action.help = f"{action.help} [env {env}=1]"
        return
    if os.environ.get(env):
        action.default = action.type(os.environ[env]) if action.type else os.environ[env]
    action.help = f"{action.help} [env {env}]"


def _resolve_switches(args: argparse.Namespace) -> str:
    """Switches not given take their environment variable; returns the problem, if any."""
    for dest, env in _SWITCHES.items():
        if getattr(args, dest, False) is not None:
            continue
        value = os.environ.get(env, "").strip().lower()
        if value not in _TRUE + _FALSE:
            return f"${env} must be 1/true/yes/on or 0/false/no/off, not {os.environ[env]!r}"
        setattr(args, dest, value in _TRUE)
    return ""


def _choice(*allowed: str):
    """``choices`` for an option with an environment variable: argparse checks
    choices only on the command line, a type on the variable's value too."""
    def check(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    check.choices = allowed  # for shell completion
    return check


def _bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None,
                        help="Kafka HOST:PORT[,HOST:PORT] (default $TRAINWARDEN_KAFKA); 'memory' is only for tests "
                             "[env TRAINWARDEN_KAFKA]")
    security = parser.add_argument_group("Kafka security (TLS, SASL; no flag for a password: it would show in ps)")

    def flag(setting: str, help: str, **kwargs) -> None:
        env = kafka_security.ENV_PREFIX + setting
        security.add_argument(kafka_security.SETTINGS[setting], action=_KafkaSecurityFlag, setting=setting,
                              default=None, help=f"{help} [env {env}]", **kwargs)

    flag("SECURITY_PROTOCOL", "how to reach the brokers (default PLAINTEXT)",
         type=_choice(*kafka_security.PROTOCOLS), metavar="PROTOCOL")
    flag("SASL_MECHANISM", "SASL login mechanism, for the SASL_ protocols", type=_choice(*kafka_security.MECHANISMS),
         metavar="MECHANISM")
    flag("SASL_USERNAME", "SASL user", metavar="USER")
    flag("SASL_PASSWORD_FILE", "file holding the SASL password (or $TRAINWARDEN_KAFKA_SASL_PASSWORD)",
         metavar="FILE")
    flag("SSL_CAFILE", "PEM file of the CA that signed the brokers' certificates (default: the system's)",
         metavar="FILE")
    flag("SSL_CERTFILE", "PEM client certificate, for brokers that ask for one", metavar="FILE")
    flag("SSL_KEYFILE", "PEM private key of the client certificate", metavar="FILE")
    flag("SSL_KEY_PASSWORD_FILE", "file holding the client key's password, if it is encrypted", metavar="FILE")
    # Without it argparse would take --kafka-sasl-password for an abbreviation
    # of --kafka-sasl-password-file, and a password for a file name.
    security.add_argument("--kafka-sasl-password", action=_PasswordFlagRefused, nargs="?", metavar="REFUSED",
                          help="refused: a password on the command line shows in ps; give "
                               "--kafka-sasl-password-file, or the variable [env TRAINWARDEN_KAFKA_SASL_PASSWORD]")


class _KafkaSecurityFlag(argparse.Action):
    """A Kafka security flag. Every bus reads these settings where the
    variables are read (KafkaSecurity.from_env, which checks them naming the
    variable and the flag), so a flag given on the command line is handed
    there while parsing, before any bus is opened; it is not exported into
    the environment, which an agent passes on to its instances."""

    def __init__(self, option_strings, dest, setting: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.setting = setting

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        kafka_security.set_by_flag(self.setting, values)


class _PasswordFlagRefused(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        # The value is not repeated: it is a password.
        parser.error("--kafka-sasl-password is not accepted: a password on the command line shows in ps; "
                     "give --kafka-sasl-password-file FILE or $TRAINWARDEN_KAFKA_SASL_PASSWORD")


def _metrics_address(text: str):
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _service_options(parser: argparse.ArgumentParser) -> None:
    _option(parser, "--metrics-address", type=_metrics_address, metavar="HOST:PORT",
            help="serve Prometheus metrics at /metrics, liveness at /healthz and readiness at /readyz here "
                 "(default: no HTTP listener)")
    _option(parser, "--log-format", default="text", type=_choice(*LOG_FORMATS),
            help="text (the default) or json: one JSON object per line with time, level, component, job_id, "
                 "message")
    _bootstrap(parser)
    _signing_options(parser)


def _signing_options(parser: argparse.ArgumentParser) -> None:
    """How a command's bus messages are signed and checked (docs/MESSAGES.md, "Signed messages")."""
    _option(parser, "--signing-key-file", metavar="FILE",
            help="the signing keyring: lines KEY_ID SECRET, the first key signs, every key verifies (or one key in "
                 "$TRAINWARDEN_SIGNING_KEY); without a key, messages are unsigned")
    _option(parser, "--signing-max-age", type=_signing_max_age, metavar="SECONDS",
            help="a message signed longer ago than this when the broker appended it is refused as expired "
                 "(default 600); a producer's clock behind the broker's by more looks the same")
    _switch(parser, "--trusted-network", help="without a signing key, use a broker that is not on this host anyway: "
                                              "only trusted hosts can reach it")


def _signing_max_age(text: str) -> float:
    from trainwarden.bus.signing import max_age

    try:
        return max_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _signing(args: argparse.Namespace) -> dict:
    return {"key_file": args.signing_key_file, "trusted_network": args.trusted_network,
            "max_age_s": args.signing_max_age, "accept_unsigned_logs": getattr(args, "accept_unsigned_logs", None)}


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    problem = _resolve_switches(args)
    if problem:
        return fail(problem, hint="unset it or give the flag on the command line")
    try:
        if args.command == "kafka":
            # Admin only: creating topics produces no message, so no key is needed.
            created = open_bus(args.bootstrap, trusted_network=True).create_topics(topic_specs(args.partitions))
            err_console.print(f"topics ready ({len(created)} created): " + ", ".join(s.name for s in topic_specs(1)))
            return 0
        if args.command == "submit":
            return _submit(args, command)
        if args.command == "nodes":
            return _nodes(args)
        return _service(args)
    except BusError as exc:
        return fail(str(exc), exc.hint or "is Kafka running? deploy/kafka/local-kafka start", code=1)


# --------------------------------------------------------------- services


def _service(args: argparse.Namespace) -> int:
    try:
        run = ServiceRun(args.command, args.log_format, args.metrics_address)
    except OSError as exc:
        return fail(f"--metrics-address {args.metrics_address}: cannot listen there ({exc.strerror or exc})",
                    hint="give an address of this host and a free port, e.g. --metrics-address 0.0.0.0:9464")
    try:
        return _start(args, run)
    finally:
        run.close()


def _start(args: argparse.Namespace, run: ServiceRun) -> int:
    observer = run.observer
    bus = run.open_bus(args.bootstrap, **_signing(args))
    reload = None
    if args.command == "agent":
        from trainwarden.runtime.c4d_source import c4d_flags_problem
        from trainwarden.runtime.logfiles import limits_from_flags
        from trainwarden.services.agent import Agent

        if not 1 <= args.slots <= 4096:
            return fail("--slots must be from 1 to 4096")
        if not 0 <= args.readopt_grace <= 3600:
            return fail(f"--readopt-grace must be from 0 to 3600 seconds, not {args.readopt_grace:g}",
                        hint="keep it under the actuator's --node-timeout (default 10) less a heartbeat")
        run_as = _run_as(args.run_as)
        if isinstance(run_as, int):
            return run_as
        log_dir = Path(args.log_dir or default_store_dir().parent / f"agent-{args.node}" / "logs")
        refused = c4d_flags_problem(args.c4d_log, args.c4d_socket)
        if refused:
            return fail(*refused)
        log_limits, problem = limits_from_flags(args.log_file_max_mb, args.log_files_kept)
        if log_limits is None:
            return fail(problem, hint="for example --log-file-max-mb 64 --log-files-kept 2")
        service = Agent(bus, args.node, args.slots, log_dir, address=args.address, ship_logs=not args.no_ship_logs,
                        c4d_log=Path(args.c4d_log) if args.c4d_log else None,
                        c4d_socket=Path(args.c4d_socket) if args.c4d_socket else None,
                        run_as=run_as, log_limits=log_limits, readopt_grace_s=args.readopt_grace,
                        **registry.agent_setup(vars(args)))
        observer.watch(lambda: service.counters, [
            ("agent_instances_running", "Instances this agent runs now.", lambda: len(service.running)),
            ("agent_slots", "Instances this node can run at once.", lambda: service.slots),
            ("agent_sdk_connections", "SDK connections open now.", lambda: service.control.open_connections)])
        observer.readiness_check(lambda: directory_writable(log_dir, "the log directory"))
        label = f"agent {args.node} ({args.slots} slots, logs in {log_dir}" + (
            f", instances run as {run_as.describe()})" if run_as else ")")
    elif args.command == "processor":
        from trainwarden.services.processor import Processor

        latency = observer.histogram("decision_latency_seconds", "Seconds from the observation a decision "
                                     "answers (a fault, an exit, a submission) to its publication by the processor.")
        service = Processor(bus, load_rules(args.rules), on_decision=lambda d: latency.observe(
            max(0.0, clock_now() - (d.detected_at or d.time))))
        observer.watch(lambda: service.counters, [
            ("processor_jobs", "Jobs whose engine state this processor holds.", lambda: len(service.jobs))])
        reload = _rules_reload(service, args.rules)
        label = f"processor (rules {args.rules or 'shipped'})"
    elif args.command == "notifier":
        return _notifier(args, bus, run)
    else:
        from trainwarden.services.actuator_service import ActuatorService

        store = store_target(args)
        run_as = _run_as(args.run_as)
        if isinstance(run_as, int):
            return run_as
        sites = registry.sites(vars(args), run_as)
        if run_as and not any(k.runs_as and k.name in sites for k in registry.submitted()):
            return fail("--run-as applies to the jobs this actuator submits to a runtime's engine, and it has none",
                        hint=f"give {' or '.join(registry.run_as_flags())} too, or --run-as to each agent instead")
        service = ActuatorService(bus, open_writer(store), node_timeout_s=args.node_timeout, sites=sites,
                                  say=lambda text, job_id="": run.say("info", text, job_id))
        observer.watch(lambda: service.counters, [
            ("actuator_jobs", "Jobs this actuator supervises.", lambda: len(service.jobs)),
            ("actuator_nodes", "Nodes this actuator has heard of.", lambda: len(service.cluster.nodes))])
        observer.readiness_check(lambda: store_writable(store))
        label = f"actuator (history in {store}" + "".join(
            f", {site.describe()}" for site in sites.values() if site.describe()) + (
            f", run as {run_as.describe()})" if run_as else ")")
    return run.run(service, label, reload)


def _runtime_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The options the registry's runtimes add to this command (runtime/registry.py)."""
    for kind in registry.runtimes():
        for option in kind.options:
            if option.command == command:
                _option(parser, option.flag, env=option.env, help=option.help, metavar=option.metavar or None)


def _run_as(text: str | None):
    """--run-as's user, None without it, or the exit code of its refusal."""
    from trainwarden.runtime.run_as import RunAsError, resolve

    try:
        return resolve(text) if text else None
    except RunAsError as exc:
        return fail(str(exc), hint=exc.hint)


def _rules_reload(processor, directory: str | None) -> Reload:
    """SIGHUP: the rules directory parsed beside the loop, then swapped in for the jobs submitted from then on."""
    where = directory or "the shipped rules"

    def swap(pack) -> str:
        processor.use_rules(pack)
        return (f"rules reloaded from {where}: {len(pack.files)} files, {len(pack.classifiers)} classifiers; "
                "jobs submitted from now on use them")

    return Reload(parse=lambda: load_rules(directory), swap=swap,
                  refused=lambda exc: f"rules not reloaded from {where}, the previous rules stay: {exc}")


def _notifier(args: argparse.Namespace, bus, run: ServiceRun) -> int:
    from trainwarden.notify import load_subscriptions
    from trainwarden.notify.bridge import DecisionNotifications
    from trainwarden.notify.queue import QueueError
    from trainwarden.services.notifier_service import NotifierService

    if not args.notifications:
        return fail("the notifier needs --notifications DIR (or $TRAINWARDEN_NOTIFICATIONS)",
                    hint="for example --notifications rules/notifications")
    if not 0 < args.max_age <= 30 * 86400:
        return fail("--max-age must be from 0 to 2592000 seconds")
    # A stopping notifier sends only what is due at once: the rest (a held
    # rate-limited message, a retry in backoff) stays queued for its successor.
    options = dataclasses.replace(notify_options(args), drain_s=STOP_DRAIN_S)
    store = store_target(args)
    observer = run.observer
    writer = ObservedDeliveries(open_writer(store), observer.histogram(
        "delivery_latency_seconds", "Seconds from an event to its delivery's accepted answer (rate-limit holds "
                                    "and retries included)."))

    def notifications(opts):
        return DecisionNotifications(opts, writer, lambda text: run.say("info", text))

    try:
        service = NotifierService(bus, notifications(options), max_age_s=args.max_age)
    except QueueError as exc:
        return fail(str(exc), hint="one notifier per queue directory: give this one its own --notify-dir")
    observer.watch(lambda: service.counters, [
        ("notifier_decisions_held", "Decisions waiting for a stack report or behind one.",
         lambda: len(service.held)),
        ("notifier_deliveries_pending", "Deliveries queued on disk, held ones included.",
         lambda: service.notifications.notifier.pending())])
    observer.counter_family("notifier_deliveries", "Deliveries by outcome (delivered, dead, retries, suppressed, "
                                                   "...).", "outcome",
                            lambda: dict(service.notifications.notifier.counters))
    observer.readiness_check(lambda: store_writable(store) or directory_writable(options.directory,
                                                                                  "the notification queue"))

    def swap(subscriptions) -> str:
        service.replace_notifications(lambda: notifications(dataclasses.replace(options, subscriptions=subscriptions)))
        return f"subscriptions reloaded from {args.notifications}: {len(subscriptions)}"

    # SIGHUP: the subscriptions (templates rendered with samples) checked beside the loop, then swapped in.
    reload = Reload(parse=lambda: load_subscriptions(Path(args.notifications)), swap=swap,
                    refused=lambda exc: f"subscriptions not reloaded, the previous ones stay: {exc}")
    return run.run(service, f"notifier ({len(options.subscriptions)} subscriptions, queue in "
                            f"{options.directory}, deliveries in {store})", reload)


# ---------------------------------------------------------------- submit


def _submit(args: argparse.Namespace, command: list[str]) -> int:
    import msgspec

    from trainwarden.cli.output import plural, print_outcome
    from trainwarden.services.follow import Follower, decision_event, line_event, submit

    if args.job_file and command:
        return fail("give either a job file or a command after '--', not both")
    if args.json and args.output not in (None, "json"):
        return fail(f"--json and -o {args.output} disagree", hint="give one of them")
    as_json = args.json or args.output == "json"
    job = (load_job_file(args.job_file, job_id=args.job_id) if args.job_file
           else from_command(command, args.nproc, args.args or "", args.job_id, args.framework))
    # As sbatch does: a command runs where it was submitted from (a job file's in its workdir:).
    job = dataclasses.replace(job, runtime=args.runtime, workdir=job.workdir or os.getcwd())
    if args.preload:
        job = job.with_preload(parse_preload(args.preload))
    from trainwarden.cli.market_cmd import spot_bids

    bids, refused = spot_bids(job, args.market)  # before the runtime's checks: a spot job goes nowhere else
    if refused:
        return fail(*refused)
    pre_submit = registry.runtime_kind(args.runtime).pre_submit
    problem = pre_submit(args.job_file) if pre_submit is not None else ""
    if problem:
        # The runtime's engine cannot run it (its section, the cluster, a permission): nothing is submitted.
        return fail(problem, code=2)
    bus = open_bus(args.bootstrap, service="submit", **_signing(args))
    follower = Follower(bus, job.job_id) if args.follow else None
    if follower is not None and not follower.ready():
        return fail("could not subscribe to the job's output in 30 s", code=1)
    submit(bus, job, bids)
    err_console.print(f"trainwarden ▸ submitted {job.job_id} ({plural(len(job.instances()), 'instance')})")
    if as_json:
        _json_line({"event": "submitted", "job_id": job.job_id, "instances": len(job.instances()),
                    "runtime": job.runtime})
    elif follower is None:
        print(job.job_id)
    if follower is None:
        return 0
    if as_json:
        on_line = (lambda line: None) if args.quiet else (lambda line: _json_line(line_event(line)))
        on_decision = lambda d: _json_line(decision_event(d))  # noqa: E731
        flush = sys.stdout.flush
    else:
        reporter = ConsoleReporter(quiet_output=args.quiet)
        on_line, on_decision, flush = reporter.line, reporter.decision, reporter.flush
    restarts = []
    on_report = _print_report
    if as_json:
        on_report = lambda report: _json_line({"event": "stack_report", **msgspec.to_builtins(report)})  # noqa: E731

    def on_any_decision(decision) -> None:
        if decision.kind is DecisionKind.RESTART_JOB:
            restarts.append(decision)
        on_decision(decision)

    try:
        outcome = follower.follow(on_line, on_any_decision, on_report=on_report)
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # a reader that went away (| head) is not the job's outcome
        follower.close()
    succeeded = outcome is not None and outcome.kind is DecisionKind.COMPLETE_JOB
    if not as_json and outcome is not None:
        # As `run` ends; the history is where the actuator writes it (one setting, TRAINWARDEN_STORE).
        print_outcome(job.job_id, "succeeded" if succeeded else "failed", outcome.reason.value, len(restarts),
                      history=f"trainwarden history --job {job.job_id} (with the actuator's TRAINWARDEN_STORE)")
    return 0 if succeeded else 1


def _print_report(report) -> None:
    """A hang's stack report, as the actuator summed it up (the whole report is in the history)."""
    from trainwarden.cli.output import plural

    err_console.print(f"trainwarden ▸ stack report: {report.verdict}", markup=False)
    err_console.print(f"  {plural(report.processes, 'process')} dumped with {report.tool or 'no tool'}, "
                      f"{plural(report.groups, 'distinct stack')}"
                      + (f"; missing: {', '.join(report.missing)}" if report.missing else "")
                      + f"; trainwarden stacks --job {report.job_id} shows them", markup=False)


def _json_line(event: dict) -> None:
    """One event per line; job text is escaped by the encoder. A reader that
    closed the pipe ends the stream, not the follow."""
    try:
        sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
    except (BrokenPipeError, ValueError, OSError):
        pass


# ----------------------------------------------------------------- nodes


def _nodes(args: argparse.Namespace) -> int:
    bus = open_bus(args.bootstrap, service="nodes", **_signing(args))
    if args.action in ("isolate", "uncordon"):
        if not args.name:
            return fail(f"'nodes {args.action}' needs a node name", hint="see 'trainwarden nodes' for the names")
        states = _read_all(bus, ACTUATOR_STATE)
        known = set(states)
        if args.name not in known:
            # A node that has never been heard of, or a typo: writing its
            # state would create a node that is then listed as lost.
            known |= set(_listen(bus, args.listen))
        if args.name not in known:
            names = ", ".join(sorted(known)[:20]) or "none yet"
            return fail(f"no node named {args.name!r} is known to the cluster",
                        hint=f"known nodes: {names} (trainwarden nodes lists them)")
        producer = bus.producer()
        state = "isolated" if args.action == "isolate" else "ready"
        producer.send(ACTUATOR_STATE, f"node:{args.name}", encode(NodeState(
            node=args.name, state=state, time=clock_now(), reason=f"{args.action} by an operator")))
        producer.flush(30)
        producer.close()
        err_console.print(f"trainwarden ▸ node {args.name}: {state}")
        return 0
    states = _read_all(bus, ACTUATOR_STATE)
    beats = _listen(bus, args.listen)
    rows = []
    for name in sorted(set(states) | set(beats)):
        state = states.get(name)
        beat = beats.get(name)
        status = state.state if state else "ready"
        if beat is None and status != "isolated":
            status = "lost" if state else "unknown"
        rows.append({"node": name, "state": status, "reason": state.reason if state else "",
                     "slots": beat.slots if beat else 0, "running": len(beat.running) if beat else 0,
                     "last_heartbeat": beat.time if beat else 0.0})
    return listing(args, "Nodes", ["node", "state", "slots", "running", "last heartbeat", "reason"],
                   ([r["node"], r["state"], r["slots"], r["running"], iso(r["last_heartbeat"]), r["reason"]]
                    for r in rows), data=rows, names=[r["node"] for r in rows], empty="no node has been heard of.")


def _read_all(bus, topic: str) -> dict:
    from trainwarden.services.actuator_service import node_states

    consumer = bus.consumer([topic], None, from_beginning=True)
    try:
        return node_states(read_to_end(consumer))
    finally:
        consumer.close()


def _listen(bus, seconds: float) -> dict[str, Heartbeat]:
    consumer = bus.consumer([NODES], None, from_beginning=False)
    beats: dict[str, Heartbeat] = {}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for record in consumer.poll(0.2):
                try:
                    beat = decode(NODES, record.value)
                except DecodeError:
                    continue
                if beat.node.startswith("__"):
                    continue  # the actuator's probe of the bus, not a node
                if not beat.leaving:
                    beats[beat.node] = beat
                else:
                    beats.pop(beat.node, None)
    finally:
        consumer.close()
    return beats
