"""The distributed shape's commands: kafka init, agent, processor, actuator,
submit, nodes. Parsing and printing only; the work is in trainwarden.services."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import threading
import time
from pathlib import Path

from rich.markup import escape

from trainwarden.bus import ACTUATOR_STATE, NODES, BusError, open_bus, topic_specs
from trainwarden.bus.base import read_to_end
from trainwarden.bus.messages import Heartbeat, NodeState
from trainwarden.bus.serde import DecodeError, decode, encode
from trainwarden.cli.notify_cmd import add_notify_options, notify_options
from trainwarden.cli.output import ConsoleReporter, err_console, fail, iso, print_json, table
from trainwarden.events import DecisionKind
from trainwarden.jobspec import from_command, load_job_file
from trainwarden.rules.loader import load_rules
from trainwarden.runtime.clock import now as clock_now
from trainwarden.store import default_store_dir, open_writer

COMMANDS = frozenset({"kafka", "agent", "processor", "actuator", "notifier", "submit", "nodes"})
TAKES_COMMAND = frozenset({"submit"})


def add_commands(sub) -> None:
    kafka = sub.add_parser("kafka", help="Kafka topics for the distributed services")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", metavar="ACTION")
    kafka_sub.required = True
    init = kafka_sub.add_parser("init", help="create the topics (idempotent)")
    init.add_argument("--partitions", type=int, default=8, help="partitions of the job topics (default 8)")
    _bootstrap(init)

    agent = sub.add_parser("agent", help="run the node agent: starts instances placed on this node")
    agent.add_argument("--node", default=os.environ.get("TRAINWARDEN_NODE") or socket.gethostname(),
                       help="this node's name (default: $TRAINWARDEN_NODE or the host name)")
    agent.add_argument("--slots", type=int, default=8, help="instances this node can run at once (default 8)")
    agent.add_argument("--log-dir", default=None, help="where instance output files go (for Vector)")
    agent.add_argument("--address", default="", help="address other nodes reach this one at (MASTER_ADDR)")
    agent.add_argument("--c4d-log", default=os.environ.get("TRAINWARDEN_C4D_LOG"),
                       help="the C4D agent's log file on this node: the trusted diagnostic channel")
    agent.add_argument("--slurm-dir", default=os.environ.get("TRAINWARDEN_SLURM_DIR"),
                       help="on a Slurm node: the directory shared with the actuator's --slurm-dir; the agent "
                            "follows the Slurm tasks on its node (--node must be the Slurm node name)")
    agent.add_argument("--no-ship-logs", action="store_true",
                       help="write output files only, for Vector to ship (lines would otherwise arrive twice)")
    _bootstrap(agent)

    processor = sub.add_parser("processor", help="run the stream processor: the engine over Kafka")
    processor.add_argument("--rules", help="rules directory (default: the shipped rules)")
    _bootstrap(processor)

    actuator = sub.add_parser("actuator", help="run the actuator: places instances, executes decisions")
    actuator.add_argument("--store", help="history store: a directory (chDB) or http(s)://user@host:port/db")
    actuator.add_argument("--slurm-dir", default=os.environ.get("TRAINWARDEN_SLURM_DIR"),
                          help="run jobs submitted with --runtime slurm through Slurm; plans, task manifests and "
                               "output files go here (a directory every Slurm node sees)")
    actuator.add_argument("--slurm-conf", default=os.environ.get("SLURM_CONF"),
                          help="the slurm.conf to use (default: $SLURM_CONF)")
    actuator.add_argument("--node-timeout", type=float, default=10.0,
                          help="seconds without a heartbeat before a node is lost (default 10)")
    _bootstrap(actuator)

    notifier = sub.add_parser("notifier", help="run the notifier: decisions as signed webhook events",
                              description="Reads the decisions topic in its own group and delivers the events to "
                                          "the subscriptions (docs/EVENTS.md); the delivery log goes to the store.")
    add_notify_options(notifier)
    notifier.add_argument("--store", help="history store for the delivery log: a directory (chDB) or "
                                          "http(s)://user@host:port/db")
    notifier.add_argument("--max-age", type=float, default=3600.0,
                          help="decisions older than this many seconds when first read are not announced "
                               "(default 3600)")
    _bootstrap(notifier)

    submit = sub.add_parser("submit", help="submit a job to the cluster",
                            description="trainwarden submit JOB.yaml | trainwarden submit [--nproc N] -- CMD ...")
    submit.add_argument("job_file", nargs="?")
    submit.add_argument("--job-id")
    submit.add_argument("--nproc", type=int, default=1)
    submit.add_argument("--args", default=None)
    submit.add_argument("--framework", default="pytorch")
    submit.add_argument("--runtime", default="agents", choices=("agents", "slurm"),
                        help="where the cluster runs it: Trainwarden's agents (default) or Slurm")
    submit.add_argument("--follow", action="store_true", help="stream output and exit 0/1 with the outcome")
    submit.add_argument("--quiet", action="store_true", help="with --follow: decisions only")
    _bootstrap(submit)

    nodes = sub.add_parser("nodes", help="list nodes; isolate or uncordon one")
    nodes.add_argument("action", nargs="?", choices=("list", "isolate", "uncordon"), default="list")
    nodes.add_argument("name", nargs="?")
    nodes.add_argument("--json", action="store_true")
    nodes.add_argument("--listen", type=float, default=2.5, help="seconds to listen for heartbeats (default 2.5)")
    _bootstrap(nodes)


def _bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=None,
                        help="Kafka HOST:PORT (default $TRAINWARDEN_KAFKA); 'memory' is only for tests")


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    try:
        if args.command == "kafka":
            created = open_bus(args.bootstrap).create_topics(topic_specs(args.partitions))
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
    bus = open_bus(args.bootstrap)
    if args.command == "agent":
        from trainwarden.services.agent import Agent

        if not 1 <= args.slots <= 4096:
            return fail("--slots must be from 1 to 4096")
        log_dir = Path(args.log_dir or default_store_dir().parent / f"agent-{args.node}" / "logs")
        service = Agent(bus, args.node, args.slots, log_dir, address=args.address, ship_logs=not args.no_ship_logs,
                        c4d_log=Path(args.c4d_log) if args.c4d_log else None,
                        slurm_dir=Path(args.slurm_dir) if args.slurm_dir else None)
        label = f"agent {args.node} ({args.slots} slots, logs in {log_dir})"
    elif args.command == "processor":
        from trainwarden.services.processor import Processor

        service = Processor(bus, load_rules(args.rules))
        label = "processor"
    elif args.command == "notifier":
        return _notifier(args, bus)
    else:
        from trainwarden.services.actuator_service import ActuatorService

        store = args.store or os.environ.get("TRAINWARDEN_STORE") or str(default_store_dir())
        slurm = None
        if args.slurm_dir:
            from trainwarden.runtime.slurm.cli import SlurmCli
            from trainwarden.runtime.slurm.runtime import SlurmSite

            slurm = SlurmSite(SlurmCli(args.slurm_conf), Path(args.slurm_dir))
        service = ActuatorService(bus, open_writer(store), node_timeout_s=args.node_timeout, slurm=slurm,
                                  say=lambda text: err_console.print(f"trainwarden ▸ actuator: {escape(text)}"))
        label = f"actuator (history in {store}" + (f", Slurm jobs in {args.slurm_dir})" if slurm else ")")
    return run_service(service, label)


def _notifier(args: argparse.Namespace, bus) -> int:
    from trainwarden.notify.bridge import DecisionNotifications
    from trainwarden.notify.queue import QueueError
    from trainwarden.services.notifier_service import NotifierService

    if not args.notifications:
        return fail("the notifier needs --notifications DIR (or $TRAINWARDEN_NOTIFICATIONS)",
                    hint="for example --notifications rules/notifications")
    if not 0 < args.max_age <= 30 * 86400:
        return fail("--max-age must be from 0 to 2592000 seconds")
    options = notify_options(args)
    store = args.store or os.environ.get("TRAINWARDEN_STORE") or str(default_store_dir())
    try:
        notifications = DecisionNotifications(options, open_writer(store),
                                              lambda text: err_console.print(f"trainwarden ▸ notifier: {text}",
                                                                             markup=False, highlight=False))
    except QueueError as exc:
        return fail(str(exc), hint="one notifier per queue directory: give this one its own --notify-dir")
    service = NotifierService(bus, notifications, max_age_s=args.max_age)
    return run_service(service, f"notifier ({len(options.subscriptions)} subscriptions, queue in "
                                f"{options.directory}, deliveries in {store})")


def run_service(service, label: str) -> int:
    from trainwarden.services.loop import serve

    stopping = threading.Event()

    def request_stop(signum, frame):
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, request_stop)
    styles = {"info": "", "warning": "yellow", "error": "red", "health": "dim"}

    def say(level: str, text: str) -> None:
        style = styles.get(level, "")
        line = f"trainwarden ▸ {label}: {text}"
        err_console.print(f"[{style}]{escape(line)}[/]" if style else line, highlight=False, markup=bool(style))

    err_console.print(f"trainwarden ▸ {label}: running", highlight=False)
    serve(service, stopping.is_set, say)
    err_console.print(f"trainwarden ▸ {label}: stopped")
    return 0


# ---------------------------------------------------------------- submit


def _submit(args: argparse.Namespace, command: list[str]) -> int:
    from trainwarden.services.follow import Follower, submit

    if args.job_file and command:
        return fail("give either a job file or a command after '--', not both")
    job = (load_job_file(args.job_file, job_id=args.job_id) if args.job_file
           else from_command(command, args.nproc, args.args or "", args.job_id, args.framework))
    job = dataclasses.replace(job, runtime=args.runtime)
    if job.spot:
        # The cluster has no market service yet: a spot job must not silently run on ordinary capacity.
        return fail("spot jobs run in the embedded mode only for now",
                    hint="run it with: trainwarden run JOB.yaml --market TRACE")
    bus = open_bus(args.bootstrap)
    follower = Follower(bus, job.job_id) if args.follow else None
    if follower is not None and not follower.ready():
        return fail("could not subscribe to the job's output in 30 s", code=1)
    submit(bus, job)
    err_console.print(f"trainwarden ▸ submitted {job.job_id} ({len(job.instances())} instances)")
    if follower is None:
        print(job.job_id)
        return 0
    reporter = ConsoleReporter(quiet_output=args.quiet)
    try:
        outcome = follower.follow(reporter.line, reporter.decision)
    except KeyboardInterrupt:
        return 130
    finally:
        reporter.flush()
        follower.close()
    succeeded = outcome is not None and outcome.kind is DecisionKind.COMPLETE_JOB
    return 0 if succeeded else 1


# ----------------------------------------------------------------- nodes


def _nodes(args: argparse.Namespace) -> int:
    bus = open_bus(args.bootstrap)
    if args.action in ("isolate", "uncordon"):
        if not args.name:
            return fail(f"'nodes {args.action}' needs a node name")
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
    if args.json:
        print_json(rows)
        return 0
    table("Nodes", ["node", "state", "slots", "running", "last heartbeat", "reason"],
          ([r["node"], r["state"], r["slots"], r["running"], iso(r["last_heartbeat"]), r["reason"]] for r in rows))
    return 0


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
