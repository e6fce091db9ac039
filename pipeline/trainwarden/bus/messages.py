"""Messages that exist only on the bus (the engine's vocabulary is in
``trainwarden.events``). Field names are the wire format; see docs/MESSAGES.md."""

from __future__ import annotations

from typing import Optional

import msgspec

from trainwarden.events import Decision, InstanceSpec, JobSpec, Offer, Stream
from trainwarden.store.records import DeadLetter, DiagnosisRecord


class Line(msgspec.Struct, frozen=True, array_like=True):
    """One output line: [time, stream, text] on the wire, to keep batches small."""

    time: float
    stream: Stream
    text: str


class LogBatch(msgspec.Struct, frozen=True, tag="log_batch"):
    """Output lines of one instance incarnation, in order: what agents
    shipped before ``node_log_batch``, still taken (processors are upgraded
    before agents)."""

    job_id: str
    node: str
    instance: str
    round: int
    start: int
    lines: tuple[Line, ...]


class LogPart(msgspec.Struct, frozen=True):
    """Output lines of one instance incarnation, in order: a part of a ``NodeLogBatch``."""

    instance: str
    round: int
    start: int
    lines: tuple[Line, ...]


class NodeLogBatch(msgspec.Struct, frozen=True, tag="node_log_batch"):
    """Output lines of one job's incarnations on one node, shipped in one
    turn (from an agent): one message per job and turn, not one per
    instance, whose per-message cost dominated an agent's and the broker's
    at a thousand instances (docs/PERFORMANCE.md)."""

    job_id: str
    node: str
    parts: tuple[LogPart, ...]


class WireLogLine(msgspec.Struct, frozen=True, tag="log_line"):
    """One output line, as Vector ships it from an agent's log file."""

    job_id: str
    node: str
    instance: str
    round: int
    start: int
    time: float
    text: str
    stream: Stream = Stream.STDOUT


class DecisionRecord(msgspec.Struct, frozen=True, tag="decision_record"):
    """The processor's own decision, written into the job's event partition so
    that a replay meets it in order with the events that followed it."""

    decision: Decision
    # Offset of the last event of this partition processed before deciding:
    # where a replay applies a timer's decision.
    after_offset: int = -1


class RunningInstance(msgspec.Struct, frozen=True):
    job_id: str
    instance: str
    round: int
    start: int
    pid: int = 0


class Heartbeat(msgspec.Struct, frozen=True, tag="heartbeat"):
    node: str
    time: float
    slots: int
    running: tuple[RunningInstance, ...] = ()
    address: str = "127.0.0.1"
    leaving: bool = False  # the agent is shutting down on purpose
    # This run of the agent (new at each start; "" from agents before 2026-12):
    # a new run reporting in within the node timeout is a restarted agent,
    # whose previous run's instances not in ``running`` are gone.
    run: str = ""


class StartInstance(msgspec.Struct, frozen=True, tag="start_instance"):
    node: str
    job_id: str
    action_id: str
    instance: InstanceSpec
    round: int
    start: int
    world_size: int
    master_addr: str
    master_port: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = ""
    max_restarts: int = 0
    # Modules the agent's standby interpreters import for the job (runtime/standby.py).
    preload: tuple[str, ...] = ()


class StartInstances(msgspec.Struct, frozen=True, tag="start_instances"):
    """Several starts for one node of one job, in order (from the actuator):
    a round's starts go to each node in one message, not one per instance,
    whose per-record cost every agent paid for every node's commands."""

    node: str
    job_id: str
    starts: tuple[StartInstance, ...]


class StopInstances(msgspec.Struct, frozen=True, tag="stop_instances"):
    node: str
    job_id: str
    action_id: str
    instances: tuple[str, ...]  # empty: every instance of the job on this node
    grace_s: float = 10.0
    # (instance, round, start) to stop exactly these incarnations; empty:
    # whatever incarnation of the named instances runs when the command arrives.
    incarnations: tuple[tuple[str, int, int], ...] = ()
    # A hung job: dump the instances' stacks before stopping them, and send
    # them (stack_dumps) under this report id.
    snapshot_report: str = ""
    # The job is over: once nothing of it runs on the node, its agent lets go
    # of what it kept for the job (standby interpreters, the keeper).
    job_ended: bool = False


class ExpectTasks(msgspec.Struct, frozen=True, tag="expect_tasks"):
    """The incarnations the actuator is about to start through a scheduler
    (a runtime that places its tasks itself), for every agent (node "*"):
    the one whose node the scheduler picks adopts a task only when its token
    hashes to one announced here."""

    node: str  # "*": every agent
    job_id: str
    # (instance, round, start, sha256 of the incarnation's SDK token)
    incarnations: tuple[tuple[str, int, int, str], ...]
    allocation: int = 0  # the scheduler's job the tasks run in (for the logs; read by no agent)


class StackDumps(msgspec.Struct, frozen=True, tag="stack_dumps"):
    """One node's stack dumps of a hung job's instances, for the actuator's report."""

    node: str
    job_id: str
    report_id: str
    time: float
    dumps_json: str  # [{"pid", "instance", "tool", "threads": [{"id", "name", "main", "frames": [[f, file, line]]}]}]
    missing: tuple[str, ...] = ()


class StackReportReady(msgspec.Struct, frozen=True, tag="stack_report_ready"):
    """The actuator built a hung job's stack report (the whole report is in the
    history); the notifier attaches this summary to the hang notification."""

    report_id: str  # the hang decision's action id
    job_id: str
    time: float
    tool: str
    processes: int
    groups: int
    suspects: tuple[str, ...]
    verdict: str
    missing: tuple[str, ...] = ()


class ActionIntent(msgspec.Struct, frozen=True, tag="action_intent"):
    """The actuator is about to carry out this decision: durable before its
    first command, under the key its ``action_done`` replaces. A new actuator
    that finds it without that record finishes the action from it (the same
    incarnations) instead of doing it anew."""

    action_id: str
    job_id: str
    time: float
    decision: Decision


class ActionDone(msgspec.Struct, frozen=True, tag="action_done"):
    action_id: str
    job_id: str
    time: float
    kind: str
    spec: Optional[JobSpec] = None  # START_JOB keeps the job's spec for later restarts
    instances: tuple[InstanceSpec, ...] = ()
    settings_args: str = ""
    # (instance, round, start) of every incarnation the action started: a new
    # actuator knows which incarnation is current from its own records, never
    # from what the agents report.
    incarnations: tuple[tuple[str, int, int], ...] = ()


class NodeState(msgspec.Struct, frozen=True, tag="node_state"):
    node: str
    state: str  # ready, isolated
    time: float
    reason: str = ""


class DeadLetterMessage(msgspec.Struct, frozen=True, tag="dead_letter"):
    time: float
    service: str
    topic: str
    partition: int
    offset: int
    key: str
    error: str
    value: str  # the raw value, decoded with replacement and bounded


class Recorded(msgspec.Struct, frozen=True, tag="recorded"):
    """History rows the processor's intake derived (a C4D finding, trusted or
    printed by the job; a dead letter when the engine raised), on the
    decisions topic for the actuator, which owns the history, to write."""

    job_id: str
    diagnoses: tuple[DiagnosisRecord, ...] = ()
    dead_letters: tuple[DeadLetter, ...] = ()


class MarketQuote(msgspec.Struct, frozen=True, tag="market_quote"):
    """What the market service saw on offer (every instance type of its
    market, a full snapshot), on the market topic for every processor; each
    processor hands it to the engines of the spot jobs it owns as their
    ``market_update`` (services/market_feed.py)."""

    market: str  # the provider's name
    epoch: str  # one per market service start: seq and time count within it
    seq: int  # 0, 1, 2, ... within the epoch: a gap is a missed quote
    time: float  # when it was polled, on the market service's clock (compared only with its own)
    at: float  # seconds since the market's origin (a trace's time)
    valid_s: float  # how long it holds: the service quotes again well before, changed or not
    offers: tuple[Offer, ...]
