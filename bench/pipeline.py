"""The distributed pipeline on a real Kafka broker: how fast the processor
reads logs compared with a bare consumer, and how long a failure takes to
become a restart command.

1. raw consume     N log lines of one synthetic 64-instance job, produced as
                   ``log_batch`` messages; a bare kafka-python consumer reads
                   exactly those messages (bytes only, no decoding).
2. processor       the same messages through a real ``Processor`` in this
                   process (a fresh consumer group); only the span in which it
                   takes these lines is timed.
3. decision        ``Processor`` + ``ActuatorService`` + a fake agent here (it
   latency         heartbeats one big node and reads the commands): K jobs
                   are started, one instance exits with an NCCL error, and the
                   time from producing that exit to the agent reading the
                   round-1 ``start_instance`` is measured.

Every synthetic job is completed at the end (its instances exit 0), so that
no later processor replays it as still running.

    .venv/bin/python bench/pipeline.py [--bootstrap HOST:PORT] [--lines 200000] [--batch 100]
                                       [--jobs 30] [--skip-latency]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.bus import COMMANDS, EVENTS, LOGS, NODES, BusError  # noqa: E402
from trainwarden.bus.kafka import MAX_REQUEST_BYTES, KafkaBus  # noqa: E402
from trainwarden.bus.messages import Heartbeat, Line, LogBatch, StartInstance, StartInstances  # noqa: E402
from trainwarden.bus.serde import DecodeError, decode, encode  # noqa: E402
from trainwarden.clock import now as clock_now  # noqa: E402
from trainwarden.events import (  # noqa: E402
    Decision,
    DecisionKind,
    InstanceExited,
    InstanceSpec,
    InstanceStarted,
    JobSpec,
    JobSubmitted,
    RoleSpec,
    Stream,
)
from trainwarden.rules.loader import load_rules  # noqa: E402
from trainwarden.services.actuator_service import GROUP as ACTUATOR_GROUP  # noqa: E402
from trainwarden.services.actuator_service import ActuatorService  # noqa: E402
from trainwarden.services.loop import ServiceLoop  # noqa: E402
from trainwarden.services.processor import GROUP as PROCESSOR_GROUP  # noqa: E402
from trainwarden.services.processor import Processor  # noqa: E402
from trainwarden.store import open_writer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-node"
SLOTS = 1000
HEARTBEAT_S = 0.5
THROUGHPUT_INSTANCES = 64
NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
TAIL = (
    "[rank1] step 311 loss 0.4127 lr 3.00e-04 grad_norm 1.072 throughput 11873.4 tok/s mem 61.02 GiB",
    "Traceback (most recent call last):",
    '  File "/data/job/train.py", line 88, in <module>',
    "    dist.all_reduce(grads, op=dist.ReduceOp.SUM)",
    NCCL,
)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def command_line() -> str:
    python = sys.executable
    try:
        rel = os.path.relpath(python)
        if not rel.startswith(".."):
            python = rel
    except ValueError:
        pass
    return shlex.join([python, *sys.argv])


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode != 0
        return head + (" (tracked files modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def line_text(i: int, rank: int, step: int) -> str:
    # 90-110 bytes, like a trainer's per-step log line.
    return (f"[rank{rank}] step {step} loss {0.2 + (i * 7919 % 9973) / 12000:.4f} lr 3.00e-04 "
            f"grad_norm {0.5 + (i % 997) / 400:.3f} throughput {9000 + i % 5000}.{i % 10} tok/s "
            f"mem {58 + i % 7}.{i % 100:02d} GiB")


def spec_for(count: int) -> tuple[JobSpec, tuple[InstanceSpec, ...]]:
    spec = JobSpec(roles=(RoleSpec("worker", count, ("python", "train.py")),), workdir="/data/job")
    return spec, tuple(InstanceSpec(f"worker-{i}", "worker", i, i) for i in range(count))


class Offsets:
    """Partition end offsets, from a bare client that belongs to no group."""

    def __init__(self, bootstrap: str):
        import kafka

        self.kafka = kafka
        self.client = kafka.KafkaConsumer(bootstrap_servers=bootstrap, client_id="trainwarden-bench-offsets")

    def ends(self, topic: str) -> dict[int, int]:
        tps = [self.kafka.TopicPartition(topic, p) for p in sorted(self.client.partitions_for_topic(topic) or ())]
        return {tp.partition: offset for tp, offset in self.client.end_offsets(tps).items()}

    def close(self) -> None:
        self.client.close()


class Loop:
    """A service on the service loop in a thread, as tests/cluster/harness.py runs them."""

    def __init__(self, name: str, service):
        self.name = name
        self.service = service
        self.stopped = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        loop = ServiceLoop(self.service)
        while not self.stopped.is_set():
            try:
                loop.once()
            except BusError as exc:
                self.errors.append(f"BusError: {exc}")
                time.sleep(0.5)
            except BaseException as exc:  # noqa: BLE001 - reported at the end
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


class FakeAgent:
    """Heartbeats one node and records the start commands addressed to it;
    starts nothing."""

    def __init__(self, bus: KafkaBus, node: str, slots: int):
        self.node = node
        self.slots = slots
        self.producer = bus.producer()
        self.consumer = bus.consumer([COMMANDS], None, from_beginning=False)
        self.cond = threading.Condition()
        self.starts: dict[str, list[tuple[float, StartInstance]]] = {}
        self.stops = 0
        self.ignored = 0
        self._ready = False
        self._next_beat = 0.0

    def ready(self) -> bool:
        if not self._ready:
            self._ready = self.consumer.ready()
        return self._ready

    def run_once(self) -> None:
        if time.monotonic() >= self._next_beat and self.ready():
            self.producer.send(NODES, self.node, encode(Heartbeat(node=self.node, time=clock_now(),
                                                                  slots=self.slots, address="127.0.0.1")))
            self.producer.flush()
            self._next_beat = time.monotonic() + HEARTBEAT_S
        records = self.consumer.poll(0.05, max_records=500)
        seen = time.perf_counter()
        for record in records:
            try:
                command = decode(COMMANDS, record.value)
            except DecodeError:
                continue
            if command.node != self.node:
                continue
            if isinstance(command, (StartInstance, StartInstances)):
                with self.cond:
                    for start in command.starts if isinstance(command, StartInstances) else (command,):
                        self.starts.setdefault(start.job_id, []).append((seen, start))
                    self.cond.notify_all()
            else:
                self.stops += 1

    def wait_starts(self, job_id: str, round_: int, count: int, timeout_s: float) -> list[tuple[float, StartInstance]]:
        def found():
            return [s for s in self.starts.get(job_id, ()) if s[1].round == round_]

        with self.cond:
            self.cond.wait_for(lambda: len(found()) >= count, timeout_s)
            return found()

    def close(self) -> None:
        self.consumer.close()
        self.producer.close()


def group_members(admin, group: str) -> int:
    try:
        return len(admin.describe_consumer_groups([group])[0].members)
    except Exception:  # noqa: BLE001 - only a warning depends on it
        return -1


def commit_group_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit offsets for a group that has no members yet, as a member-less client."""
    import kafka

    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        partitions = [kafka.TopicPartition(topic, p) for p in offsets]
        consumer.assign(partitions)
        consumer.commit({tp: kafka.structs.OffsetAndMetadata(offsets[tp.partition], "", -1) for tp in partitions})
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("TRAINWARDEN_KAFKA") or "127.0.0.1:9092")
    parser.add_argument("--lines", type=int, default=200_000, help="log lines for the throughput runs")
    parser.add_argument("--batch", type=int, default=100, help="lines per log_batch message")
    parser.add_argument("--jobs", type=int, default=30, help="jobs for the decision latency")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if args.lines < 1 or args.batch < 1 or args.jobs < 1:
        parser.error("--lines, --batch and --jobs must be positive")

    import kafka
    from kafka.admin import KafkaAdminClient

    print(f"command              {command_line()}")
    print(f"commit               {git_commit()}")
    print(f"broker               {args.bootstrap}")
    sys.stdout.flush()

    bootstrap = args.bootstrap.removeprefix("kafka://")
    bus = KafkaBus(bootstrap, client_id="trainwarden-bench")
    run = uuid.uuid4().hex[:6]
    group = f"trainwarden-bench-processor-{run}"
    tp_job = f"bench-{run}-logs"
    offsets = Offsets(bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="trainwarden-bench-admin")
    warnings: list[str] = []
    for name in (PROCESSOR_GROUP, ACTUATOR_GROUP):
        members = group_members(admin, name)
        if members > 0:
            warnings.append(f"{members} other member(s) in consumer group {name}: another processor/actuator "
                            "runs on this broker and can take part of the work")
    producer = bus.producer()

    # ------------------------------------------------ processor, caught up
    # The processor's fresh group starts the logs topic at its current end
    # (committed before it joins): earlier runs' lines are not ours to time.
    ends = offsets.ends(LOGS)
    commit_group_offsets(args.bootstrap, group, LOGS, ends)
    decided: dict[str, tuple[float, Decision]] = {}

    def on_decision(decision: Decision) -> None:
        if decision.kind is not DecisionKind.START_JOB and decision.job_id not in decided:
            decided[decision.job_id] = (time.perf_counter(), decision)

    log(f"processor: group {group}, replaying {EVENTS}")
    pack = load_rules()
    processor = Processor(bus, pack, group=group, on_decision=on_decision)
    turns = ServiceLoop(processor)  # its iterations and ticks, as `trainwarden processor` has them
    loops: list[Loop] = []
    actuator = agent = None
    tmp = tempfile.TemporaryDirectory(prefix="trainwarden-bench-")
    try:
        started = time.monotonic()
        while not (processor.consumer.assignment() and not processor.replays):
            turns.once()
            if time.monotonic() - started > 120:
                raise SystemExit("the processor was not assigned its partitions and done replaying in 120 s")
        replay_s = time.monotonic() - started
        log(f"processor: ready in {replay_s:.1f} s ({processor.counters.replayed} events replayed, "
            f"{len(processor.jobs)} jobs known)")

        # The synthetic job: submitted and started while the processor runs.
        spec, instances = spec_for(THROUGHPUT_INSTANCES)
        t_sub = clock_now()
        producer.send(EVENTS, tp_job, encode(JobSubmitted(
            job_id=tp_job, time=t_sub, framework="pytorch", args="--enable-job-restart=True", instances=instances,
            spec=spec, activity_reports=False)))
        for i, inst in enumerate(instances):
            producer.send(EVENTS, tp_job, encode(InstanceStarted(job_id=tp_job, time=t_sub, instance=inst.name,
                                                                 round=0, start=0, node=NODE, pid=10000 + i)))
        producer.flush(30)
        started = time.monotonic()
        while True:
            turns.once()
            state = processor.jobs.get(tp_job)
            if state is not None and all(i.status.value == "running" for i in state.instances.values()):
                break
            if time.monotonic() - started > 60:
                raise SystemExit(f"the processor did not see {tp_job} and its {THROUGHPUT_INSTANCES} starts in 60 s")

        # ---------------------------------------------------- produce
        # The processor is not polled from here until it is timed.
        names = [inst.name for inst in instances]
        before = offsets.ends(LOGS)
        messages = -(-args.lines // args.batch)
        t_prod = time.perf_counter()
        line_no = 0
        base_time = clock_now()
        for m in range(messages):
            count = min(args.batch, args.lines - line_no)
            rank = m % THROUGHPUT_INSTANCES
            lines = []
            for k in range(count):
                i = line_no + k
                lines.append(Line(base_time + i * 1e-5, Stream.STDOUT, line_text(i, rank, m // THROUGHPUT_INSTANCES)))
            line_no += count
            producer.send(LOGS, tp_job, encode(LogBatch(job_id=tp_job, node=NODE, instance=names[rank], round=0,
                                                        start=0, lines=tuple(lines))))
            if m % 200 == 0:
                print(f"\rproduced {line_no:,} lines", end="", file=sys.stderr)
        producer.flush(60)
        produce_s = time.perf_counter() - t_prod
        print(f"\rproduced {line_no:,} lines", file=sys.stderr)
        after = offsets.ends(LOGS)
        grown = {p: after[p] - before.get(p, 0) for p in after if after[p] != before.get(p, 0)}
        if len(grown) != 1 or next(iter(grown.values())) != messages:
            warnings.append(f"logs partitions grew by {grown} while {messages} messages were produced: "
                            "someone else writes logs on this broker")
        partition = max(grown, key=grown.get)
        first, end = before.get(partition, 0), after[partition]
        expected_msgs = end - first

        # ---------------------------------------------------- raw consume
        raw = kafka.KafkaConsumer(bootstrap_servers=bootstrap, client_id="trainwarden-bench-raw", group_id=None,
                                  enable_auto_commit=False, max_partition_fetch_bytes=MAX_REQUEST_BYTES,
                                  fetch_max_bytes=4 * MAX_REQUEST_BYTES)
        raw.partitions_for_topic(LOGS)
        tp = kafka.TopicPartition(LOGS, partition)
        raw.assign([tp])
        raw.seek(tp, first)
        got = nbytes = 0
        t_raw = time.perf_counter()
        deadline = time.monotonic() + 120
        while got < expected_msgs and time.monotonic() < deadline:
            for items in raw.poll(timeout_ms=500, max_records=2000).values():
                for record in items:
                    if record.offset >= end:
                        continue
                    got += 1
                    nbytes += len(record.value)
        raw_s = time.perf_counter() - t_raw
        raw.close()
        if got < expected_msgs:
            raise SystemExit(f"the bare consumer read {got} of {expected_msgs} messages in 120 s")
        raw_lines = args.lines * got / expected_msgs

        # ------------------------------------------------- processor timed
        base = processor.counters.log_lines
        calls = 0
        t_proc = time.perf_counter()
        deadline = time.monotonic() + 300
        while processor.counters.log_lines - base < args.lines:
            turns.once()
            calls += 1
            if time.monotonic() > deadline:
                raise SystemExit(f"the processor took {processor.counters.log_lines - base:,} of "
                                 f"{args.lines:,} lines in 300 s")
        proc_s = time.perf_counter() - t_proc
        counted = processor.counters.log_lines - base
        if counted != args.lines:
            warnings.append(f"the processor counted {counted:,} lines, {args.lines:,} were produced")
        last_tail = processor.jobs[tp_job].instances[names[(messages - 1) % THROUGHPUT_INSTANCES]].tail
        if not last_tail or not last_tail[-1].startswith(f"[rank{(messages - 1) % THROUGHPUT_INSTANCES}]"):
            warnings.append("the last line produced is not at the end of its instance's tail in the processor")

        raw_rate = raw_lines / raw_s
        proc_rate = counted / proc_s
        print(f"log messages         {got:,} log_batch of {args.batch} lines, {nbytes / got:,.0f} B each "
              f"({nbytes / 1e6:,.1f} MB), partition {partition}")
        print(f"produce              {args.lines / produce_s:,.0f} lines/s ({produce_s:.2f} s, gzip, acks=all)")
        print(f"raw consume          {got / raw_s:,.0f} msgs/s  {raw_rate:,.0f} lines/s  "
              f"{nbytes / raw_s / 1e6:,.1f} MB/s ({raw_s:.2f} s, bare KafkaConsumer, no decoding)")
        print(f"processor            {proc_rate:,.0f} lines/s ({proc_s:.2f} s in {calls} run_once call"
              f"{'s' if calls != 1 else ''}, from the first poll; its replay before, {replay_s:.1f} s, not timed)")
        print(f"processor / raw      {proc_rate / raw_rate:.3f}")
        sys.stdout.flush()

        # ----------------------------------------------- decision latency
        jobs: list[str] = []
        if not args.skip_latency:
            log("latency: starting the actuator and the fake agent")
            actuator = ActuatorService(bus, open_writer(Path(tmp.name) / "store"),
                                       group=f"trainwarden-bench-actuator-{run}")
            agent = FakeAgent(bus, NODE, SLOTS)
            loops = [Loop("processor", processor), Loop("actuator", actuator), Loop("agent", agent)]
            started = time.monotonic()
            while not (actuator.assigned and agent._ready and NODE in actuator.cluster.nodes):
                if time.monotonic() - started > 60:
                    raise SystemExit("the actuator was not assigned or did not hear the fake agent in 60 s")
                time.sleep(0.05)
            latencies: list[float] = []
            processor_part: list[float] = []
            missing: list[str] = []
            kinds: dict[str, int] = {}
            spec2, instances2 = spec_for(2)
            for n in range(args.jobs):
                job = f"bench-{run}-lat-{n:03d}"
                jobs.append(job)
                producer.send(EVENTS, job, encode(JobSubmitted(
                    job_id=job, time=clock_now(), framework="pytorch", args="--enable-job-restart=True",
                    instances=instances2, spec=spec2, activity_reports=False)))
                producer.flush(30)
                starts = agent.wait_starts(job, 0, 2, 30)
                if len(starts) < 2:
                    missing.append(f"{job}: {len(starts)} of 2 round-0 start_instance in 30 s")
                    continue
                now = clock_now()
                for _, command in starts:
                    producer.send(EVENTS, job, encode(InstanceStarted(
                        job_id=job, time=now, instance=command.instance.name, round=command.round,
                        start=command.start, node=NODE, pid=20000 + command.instance.index)))
                producer.flush(30)
                failed = next(c for _, c in starts if c.instance.name == "worker-1")
                t0 = time.perf_counter()
                producer.send(EVENTS, job, encode(InstanceExited(
                    job_id=job, time=clock_now(), instance=failed.instance.name, round=failed.round,
                    start=failed.start, exit_code=1, tail=TAIL)))
                producer.flush(30)
                restarted = agent.wait_starts(job, 1, 1, 30)
                if not restarted:
                    kind = decided.get(job, (0, None))[1]
                    missing.append(f"{job}: no round-1 start_instance in 30 s (processor decided: "
                                   f"{kind.kind.value + '/' + kind.reason.value if kind else 'nothing'})")
                    continue
                t1 = min(t for t, _ in restarted)
                latencies.append((t1 - t0) * 1000)
                if job in decided:
                    processor_part.append((decided[job][0] - t0) * 1000)
                    label = f"{decided[job][1].kind.value}/{decided[job][1].reason.value}"
                    kinds[label] = kinds.get(label, 0) + 1
                print(f"\rjob {n + 1}/{args.jobs}: {latencies[-1]:.0f} ms", end="", file=sys.stderr)
            print(file=sys.stderr)
            if latencies:
                print(f"decision latency     p50 {percentile(latencies, 50):.1f} ms  "
                      f"p90 {percentile(latencies, 90):.1f} ms  p99 {percentile(latencies, 99):.1f} ms  "
                      f"max {max(latencies):.1f} ms  (K={len(latencies)} of {args.jobs} jobs)")
            else:
                print(f"decision latency     no restart arrived (K=0 of {args.jobs} jobs)")
            if processor_part:
                print(f"  exit -> decision   p50 {percentile(processor_part, 50):.1f} ms  "
                      f"max {max(processor_part):.1f} ms (the processor's callback, before its flush)")
            print(f"  decisions          {', '.join(f'{k} x{v}' for k, v in sorted(kinds.items())) or 'none'}")
            print("  loops              threads: processor, actuator, fake agent one each, in this process "
                  "(one GIL); exits produced from the main thread")
            warnings.extend(missing)
            sys.stdout.flush()

        # ---------------------------------------------------- clean up
        finish_jobs(producer, processor, agent, tp_job, names, jobs, loops, warnings)
        if actuator is not None:
            started = time.monotonic()
            while any(j in actuator.jobs for j in [tp_job, *jobs]) and time.monotonic() - started < 20:
                time.sleep(0.1)
            left = [j for j in [tp_job, *jobs] if j in actuator.jobs]
            if left:
                warnings.append(f"the actuator still holds {len(left)} completed job(s) after 20 s: {left[:3]}")
    finally:
        for loop in loops:
            loop.stop()
        for loop in loops:
            for error in dict.fromkeys(loop.errors):
                warnings.append(f"{loop.name} loop raised {loop.errors.count(error)}x: {error}")
        for closeable in (processor, actuator, agent):
            if closeable is not None:
                try:
                    closeable.close()
                except Exception as exc:  # noqa: BLE001
                    warnings.append(f"closing {type(closeable).__name__}: {exc}")
        producer.close()
        offsets.close()
        try:
            admin.delete_consumer_groups([group])
        except Exception as exc:  # noqa: BLE001
            warnings.append(f"could not delete the bench's consumer group {group}: {exc}")
        admin.close()
        tmp.cleanup()

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS             {rss / 1024:,.0f} MiB")
    for warning in warnings:
        print(f"warning              {warning}")
    return 1 if warnings else 0


def finish_jobs(producer, processor, agent, tp_job, names, jobs, loops, warnings) -> None:
    """Every synthetic job ends with all its instances exiting 0 (complete_job)."""
    now = clock_now()
    for name in names:
        producer.send(EVENTS, tp_job, encode(InstanceExited(job_id=tp_job, time=now, instance=name, round=0,
                                                            start=0, exit_code=0, tail=())))
    for job in jobs:
        restarted = [c for _, c in agent.starts.get(job, ()) if c.round == 1] if agent else []
        if len({c.instance.name for c in restarted}) < 2:
            if agent is not None:
                warnings.append(f"{job} is left running: {len(restarted)} of 2 round-1 starts arrived")
            continue
        for command in restarted:
            producer.send(EVENTS, job, encode(InstanceStarted(job_id=job, time=now, instance=command.instance.name,
                                                              round=command.round, start=command.start, node=NODE)))
        for command in restarted:
            producer.send(EVENTS, job, encode(InstanceExited(job_id=job, time=now, instance=command.instance.name,
                                                             round=command.round, start=command.start, exit_code=0,
                                                             tail=())))
    producer.flush(30)
    started = time.monotonic()
    threaded = bool(loops)
    turns = ServiceLoop(processor)
    while time.monotonic() - started < 30:
        if not threaded:
            turns.once()
        else:
            time.sleep(0.05)
        pending = [j for j in [tp_job, *jobs] if j in processor.jobs and not processor.jobs[j].finished]
        if not pending:
            return
    warnings.append(f"{len(pending)} synthetic job(s) did not complete in 30 s: {pending[:3]}")


if __name__ == "__main__":
    sys.exit(main())
