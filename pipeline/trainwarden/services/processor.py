"""``trainwarden processor``: the engine over the bus.

A consumer group on the events and logs topics. For each job it keeps the
engine's state, steps it with every event and with the service loop's tick
(services/loop.py, every ``TICK_S``), and publishes decisions, each also
recorded in the job's event partition (``decision_record``) so that a
successor can rebuild the state.

Recovery is replay: a processor that is assigned an events partition reads it
from the start. Decisions that events cause are derived again (same action
ids); decisions that timers caused are re-applied from their records, at the
offset where they were taken; a derived decision without a record (its
predecessor died between deciding and recording) is published again. The
actuator executes each action id once, so a replay never acts twice.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Callable, Optional

from trainwarden.bus import DEAD_LETTERS, DECISIONS, EVENTS, LOGS, PREFIX, Bus, Message
from trainwarden.bus.messages import DecisionRecord, LogBatch, NodeLogBatch, Recorded, WireLogLine
from trainwarden.bus.serde import DecodeError, dead_letter, decode, encode
from trainwarden.clock import now as clock_now
from trainwarden.engine import JobState, rebase_times, replay_decision, start_job
from trainwarden.engine.state import InstanceStatus
from trainwarden.services.market_feed import MarketFeed, send_to_events
from trainwarden.events import Decision, JobSubmitted, LogLine, Tick
from trainwarden.store.records import DeadLetter
from trainwarden.supervision.intake import Taken, take
from trainwarden.rules.model import RulePack

GROUP = f"{PREFIX}-processor"
_log = logging.getLogger("trainwarden.processor")


@dataclasses.dataclass
class ProcessorCounters:
    events: int = 0
    log_lines: int = 0
    decisions: int = 0
    dead_letters: int = 0
    engine_errors: int = 0
    replayed: int = 0
    republished: int = 0
    unknown_job: int = 0
    duplicate_submissions: int = 0
    replay_skipped: int = 0  # undecodable records a replay stepped over (dead-lettered when first met)
    lines_from_other_nodes: int = 0  # lines naming a node that does not run their incarnation: not counted
    market_updates: int = 0  # market quotes handed to spot jobs' engines (services/market_feed.py)
    market_quotes_not_taken: int = 0  # late, out of order, invalid, or from the backlog at the start
    market_unreadable: int = 0  # failed looks at the market topic (no Read on it): spot jobs wait for prices


@dataclasses.dataclass
class _Replay:
    end: int  # offset where live processing starts
    # Where the group had read to: the records from here on no processor
    # took, so their dead letters and diagnoses are still owed.
    unseen_from: int
    records: list = dataclasses.field(default_factory=list)
    logs: list = dataclasses.field(default_factory=list)  # log records of this partition held until the replay ends
    # Events past ``end`` read in the batch that ends the replay: live, but
    # taken after it (before it, their job is not known yet and they were lost).
    live: list = dataclasses.field(default_factory=list)


class Processor:
    def __init__(self, bus: Bus, pack: RulePack, group: str = GROUP,
                 clock: Callable[[], float] = clock_now, on_decision: Optional[Callable[[Decision], None]] = None):
        self.bus = bus
        self.pack = pack
        self.clock = clock
        self.on_decision = on_decision
        self.counters = ProcessorCounters()
        self.jobs: dict[str, JobState] = {}
        self.partition_of: dict[str, int] = {}
        self.last_offset: dict[int, int] = {}  # events partition -> last offset processed
        self.replays: dict[int, _Replay] = {}
        self._assigned: list = []
        self.producer = bus.producer()
        self.consumer = bus.consumer([EVENTS, LOGS], group, from_beginning=True, on_assign=self._assigned.extend)
        # Spot prices: the whole market topic, outside the group (every processor needs every quote).
        self.market = MarketFeed(bus, clock)

    def use_rules(self, pack: RulePack) -> None:
        """Rules for the jobs submitted from now on (a reload). A running job
        keeps the pack it started with: its state holds it."""
        self.pack = pack

    # ------------------------------------------------ the loop (services/loop.py)

    def run_once(self, timeout_s: float) -> None:
        """The records that come within ``timeout_s``, taken and committed."""
        records = self.consumer.poll(max(0.0, timeout_s), max_records=2000)
        sought = self._take_assignments(records)
        for record in records:
            if record.topic == EVENTS and record.partition in sought:
                # Fetched from the committed offset before the seek to the
                # beginning: the replay reads it again, in its place. Taken
                # here, it would end the replay before the records before it.
                continue
            self._route(record)
        self._finish_replays()
        self._hand_on_market()
        self.producer.flush()
        self.consumer.commit()

    def tick(self) -> None:
        """Every job's timers, on this processor's clock; their decisions published at once."""
        now = self.clock()
        for job_id, state in list(self.jobs.items()):
            partition = self.partition_of.get(job_id)
            if state.finished or partition in self.replays:
                continue
            self._publish(self._take(state, Tick(job_id=job_id, time=now), now, "", True).decisions, partition)
        self.producer.flush()

    def close(self) -> None:
        try:
            self.producer.flush(5)
        finally:
            self.consumer.close()
            self.market.close()
            self.producer.close()

    def _hand_on_market(self) -> None:
        """The quotes read since the last turn, to the spot jobs owned (not while their partition replays)."""
        self.market.poll()
        self.market.hand_on(self.jobs, lambda job_id: self.partition_of.get(job_id) in self.replays,
                            send_to_events(self.producer))
        counted = self.market.view.counters
        self.counters.market_updates = self.market.updates
        self.counters.market_unreadable = self.market.reader.failures
        self.counters.market_quotes_not_taken = counted.late + counted.out_of_order + counted.backlog + counted.invalid

    # ---------------------------------------------------------- partitions

    def _take_assignments(self, polled: list[Message]) -> set[int]:
        """The events partitions just assigned, now read again from their beginning."""
        if not self._assigned:
            return set()
        assigned, self._assigned[:] = list(self._assigned), []
        partitions = [p for topic, p in assigned if topic == EVENTS]
        # Before the seek: the poll read on from the group's committed offset.
        positions = self.consumer.positions()
        for partition in partitions:
            for job_id in [j for j, p in self.partition_of.items() if p == partition]:
                self.jobs.pop(job_id, None)
                self.partition_of.pop(job_id, None)
                self.market.forget([job_id])
            end = self.consumer.end_offset(EVENTS, partition)
            if end > 0:
                # Unknown, all of it counts as seen: a second dead letter or
                # diagnosis of a record would be a second history row.
                unseen_from = min([positions.get((EVENTS, partition), end)] + [
                    r.offset for r in polled if r.topic == EVENTS and r.partition == partition])
                self.replays[partition] = _Replay(end=end, unseen_from=unseen_from)
        self.consumer.seek_to_beginning([(EVENTS, p) for p in partitions])
        # Which processor holds a job, for an operator (and the takeover tests).
        _log.info("events partitions %s assigned: their jobs are rebuilt from the beginning",
                  ",".join(map(str, sorted(partitions))) or "none")
        return set(partitions)

    def _route(self, record: Message) -> None:
        if record.topic == EVENTS:
            replay = self.replays.get(record.partition)
            if replay is not None:
                (replay.records if record.offset < replay.end else replay.live).append(record)
                return
            self._event(record, live=True)
        elif record.partition in self.replays:
            # The jobs of this partition are being rebuilt: their lines wait
            # (they are not committed-and-lost, and they still count).
            self.replays[record.partition].logs.append(record)
        else:
            self._logs(record)

    # --------------------------------------------------------------- events

    def _decode(self, record: Message, kind: str, report: bool = True):
        try:
            return decode(kind, record.value)
        except DecodeError as exc:
            if report:
                self._dead_letter(record, str(exc))
            else:  # a replay meets messages that were dead-lettered the first time
                self.counters.replay_skipped += 1
            return None

    def _event(self, record: Message, live: bool, unseen: bool = False) -> list[Decision]:
        """unseen: a replayed record no processor took before (its dead letter
        and diagnoses are published as if it were live)."""
        message = self._decode(record, EVENTS, report=live or unseen)
        self.last_offset[record.partition] = record.offset
        if message is None or isinstance(message, DecisionRecord):
            return []  # our own records matter only to a replay
        self.counters.events += 1
        # Live: when it arrived, on this clock. A replay: the sender's time, so
        # that its decisions are derived as they first were (then rebase_times).
        now = self.clock() if live else message.time
        if isinstance(message, JobSubmitted):
            if message.job_id in self.jobs:
                self.counters.duplicate_submissions += 1
                return []
            state, decisions = start_job(message, self.pack, now)
            self.jobs[message.job_id] = state
            self.partition_of[message.job_id] = record.partition
        else:
            state = self.jobs.get(message.job_id)
            if state is None:
                self.counters.unknown_job += 1
                return []
            taken = self._take(state, message, now, "", live or unseen)
            decisions = taken.decisions
        if live:
            self._publish(decisions, record.partition)
        return decisions

    def _take(self, state: JobState, event, now: float, node: str, live: bool) -> Taken:
        """One guarded engine step; its records (diagnoses, an engine error's
        dead letter) go to the actuator, which owns the history. A replay
        derives them again: they were published the first time (``live`` is
        then False), unless no processor took the event before."""
        taken = take(state, event, now, node=node)
        self.jobs[state.job_id] = taken.state
        if taken.engine_failed:
            self.counters.engine_errors += 1
        if live and taken.records:
            self.producer.send(DECISIONS, state.job_id, encode(Recorded(
                job_id=state.job_id,
                diagnoses=tuple(r for r in taken.records if not isinstance(r, DeadLetter)),
                dead_letters=tuple(r for r in taken.records if isinstance(r, DeadLetter)))))
        return taken

    def _logs(self, record: Message) -> None:
        message = self._decode(record, LOGS)
        if message is None:
            return
        state = self.jobs.get(message.job_id)
        if state is None:
            self.counters.unknown_job += 1
            return  # exits carry their own tails; lines of an unknown job add nothing
        if isinstance(message, WireLogLine):
            # Vector's time is not the reporting agent's clock: nothing to compare it with.
            parts = [(message.instance, message.round, message.start, [(None, message.stream, message.text)])]
        elif isinstance(message, LogBatch):
            parts = [(message.instance, message.round, message.start,
                      [(line.time, line.stream, line.text) for line in message.lines])]
        else:
            assert isinstance(message, NodeLogBatch)
            parts = [(part.instance, part.round, part.start, [(line.time, line.stream, line.text) for line in part.lines])
                     for part in message.parts]
        # Dated by their arrival here, not by the agent's (or Vector's) clock:
        # silence is judged on this process's clock alone (engine/core.py).
        # The agent's time goes along only to be compared with its own reports.
        arrived = self.clock()
        for instance, round_, start, lines in parts:
            if not _from_its_node(state, instance, round_, start, message.node):
                self.counters.lines_from_other_nodes += len(lines)
                continue
            for said, stream, text in lines:
                self.counters.log_lines += 1
                event = LogLine(job_id=message.job_id, time=arrived, instance=instance, round=round_,
                                start=start, text=text, stream=stream, said=said)
                taken = self._take(state, event, arrived, message.node, True)
                state = taken.state
                self._publish(taken.decisions, record.partition)

    # ---------------------------------------------------------------- replay

    def _finish_replays(self) -> None:
        for partition, replay in list(self.replays.items()):
            # A signed bus drops what it refuses: its read offset, not the last record handed over, says the end.
            read = getattr(self.consumer, "offsets_read", {}).get((EVENTS, partition), -1)
            if max(read, replay.records[-1].offset if replay.records else -1) >= replay.end - 1:
                del self.replays[partition]
                self._replay(partition, replay)
                for record in replay.logs:
                    self._logs(record)
                for record in replay.live:
                    self._event(record, live=True)

    def _replay(self, partition: int, replay: _Replay) -> None:
        records = sorted(replay.records, key=lambda r: r.offset)
        recorded: dict[str, Decision] = {}
        timer_decisions: dict[int, list[Decision]] = collections.defaultdict(list)
        for record in records:
            try:
                message = decode(EVENTS, record.value)
            except DecodeError:
                continue  # counted by the pass below
            if isinstance(message, DecisionRecord):
                recorded[message.decision.action_id] = message.decision
                timer_decisions[message.after_offset].append(message.decision)
        derived: dict[str, Decision] = {}
        for record in records:
            self.counters.replayed += 1
            for decision in self._event(record, live=False, unseen=record.offset >= replay.unseen_from):
                derived[decision.action_id] = decision
            for decision in timer_decisions.get(record.offset, ()):
                state = self.jobs.get(decision.job_id)
                if decision.action_id not in derived and state is not None and not state.finished:
                    self.jobs[decision.job_id] = replay_decision(state, decision)
                    derived[decision.action_id] = decision
        lost = [d for action, d in derived.items() if action not in recorded]
        self.counters.republished += len(lost)
        self._publish(lost, partition)
        # The replay ran each event at its sender's time (its decisions come
        # out as they first did); the timers now run on this clock.
        now = self.clock()
        for job_id, state in self.jobs.items():
            if self.partition_of.get(job_id) == partition:
                rebase_times(state, now)

    # ------------------------------------------------------------ output

    def _publish(self, decisions: list[Decision], partition: Optional[int]) -> None:
        for decision in decisions:
            self.counters.decisions += 1
            self.producer.send(DECISIONS, decision.job_id, encode(decision))
            after = self.last_offset.get(partition, -1) if partition is not None else -1
            self.producer.send(EVENTS, decision.job_id, encode(DecisionRecord(decision, after)))
            if self.on_decision is not None:
                self.on_decision(decision)

    def _dead_letter(self, record: Message, error: str) -> None:
        self.counters.dead_letters += 1
        self.producer.send(DEAD_LETTERS, "processor", dead_letter(record, "processor", error, self.clock()))


def _from_its_node(state: JobState, instance: str, round_: int, start: int, node: str) -> bool:
    """A line counts for an incarnation only from the node the engine knows
    runs it (its InstanceStarted's): no agent, and no Vector of another node,
    keeps someone else's instance alive. Lines of an incarnation not yet
    known to have started, or no longer current, are left to the engine."""
    inst = state.instances.get(instance)
    if (inst is None or inst.status is InstanceStatus.PENDING  # its node is still the previous incarnation's
            or (round_, start) != (state.round, inst.start)):
        return True
    return inst.node == node
