"""How a restart's cost grows with the job's width, on the Kafka cluster shape.

For each size (instances on agents) this starts a real processor, actuator and
that many agents (processes on this machine, one slot per instance, topics of
their own on the broker), submits a Sync job of light shell instances that
print a line every 0.5 s (waiting with bash's own ``read -t``; ``--pause
fork`` waits with /bin/sleep, as the issue first measured), and lets rank 0 crash with a retryable NCCL error
2 s after the whole round 0 has started. Round 1's instances print a few lines
and exit 0, so the job succeeds. Times are taken on this host's clock: the
instances' own (files they write when they start and crash) and the broker's
append time of each message (``kafka init`` sets LogAppendTime), one clock.

Printed per size:
  round 0            submit -> every instance of round 0 started
  crash -> first     the crash -> the first instance of round 1 started
  crash -> all       the crash -> every instance of round 1 started
  decision           the crash -> the processor's decision on the bus
  stop               the decision -> the last round-0 exit reported
  start              the last stop's exit -> the last round-1 start
  slowest agent      the agent whose last round-1 instance started last
  CPU / memory       the cores the running job kept busy before the crash; the
                     machine's CPU seconds during the restart (crash -> all
                     started) and the cores that kept busy; both by process
                     (agents, their keepers, the instances, the broker, the
                     processor, the actuator, the submit --follow follower);
                     the processor's and actuator's peak resident memory
  messages           records on every topic during the restart; commands alone

    .venv/bin/python bench/scale.py [--sizes 16x2,128x4,512x8,1024x16] [--bootstrap HOST:PORT] [--signed] [--json]

``--signed`` gives every service one signing key made for the run: each
message sealed and each record verified, as on a bus off loopback.

Needs a broker (deploy/kafka/local-kafka start; TRAINWARDEN_KAFKA or
--bootstrap). Not a test: docs/PERFORMANCE.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
from kafka import KafkaConsumer, TopicPartition

TRAINWARDEN = [sys.executable, "-m", "trainwarden.cli.main"]
NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"
# $1: the directory the instances write their times to; $2: the job's width.
INSTANCE = r"""
d="$1"; width="$2"; r="$TRAINWARDEN_RESTART_ROUND"
STAMP
stamp "start-$r-$RANK-$TRAINWARDEN_NODE"
i=0; seen=-1
while :; do
  echo "step $i"
  if [ "$r" = 0 ]; then
    if [ "$RANK" = 0 ] && [ "$seen" -lt 0 ] && [ "$(ls "$d" | grep -c '^start-0-')" -ge "$width" ]; then seen=$i; fi
    if [ "$RANK" = 0 ] && [ "$seen" -ge 0 ] && [ "$i" -ge $((seen + 4)) ]; then
      stamp crash; echo "NCCL_LINE" >&2; exit 1
    fi
  elif [ "$i" -ge 6 ]; then
    exit 0
  fi
  i=$((i + 1)); PAUSE
done
""".replace("NCCL_LINE", NCCL)
# How an instance waits its half second: bash's own read with a timeout on a
# pipe nobody writes (no process), or /bin/sleep (a fork and exec every
# half second in each instance: 2,048 a second at 1,024 instances, which
# is what the 2-core machine then spends its time on).
# A time stamp likewise: bash's $EPOCHREALTIME written at once (read when whole), or date and mv.
PAUSES = {"builtin": ("bash", "exec 9<> <(:)\n", "read -t 0.5 -u 9 || :",
                      'stamp() { printf "%s\\n" "$EPOCHREALTIME" > "$d/$1"; }'),
          "fork": ("sh", "", "sleep 0.5", 'stamp() { date +%s.%N > "$d/.$1.$$" && mv "$d/.$1.$$" "$d/$1"; }')}


def instance_command(pause: str, marks: Path, width: int) -> list[str]:
    shell, setup, wait, stamp = PAUSES[pause]
    program = setup + INSTANCE.replace("PAUSE", wait).replace("STAMP", stamp)
    return [shell, "-c", program, "instance", str(marks), str(width)]


def _size(text: str) -> tuple[int, int]:
    try:
        width, agents = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes: {text!r} is not INSTANCESxAGENTS (e.g. 128x4)") from None
    if not (1 <= agents <= width <= 16_384):
        raise argparse.ArgumentTypeError(f"--sizes: {text!r} needs 1 <= agents <= instances <= 16384")
    return width, agents


class Services:
    """A processor, an actuator and ``agents`` agents on topics of their own."""

    def __init__(self, bootstrap: str, tmp: Path, width: int, agents: int, signed: bool = False):
        self.tmp = tmp
        self.prefix = f"twscale{uuid.uuid4().hex[:6]}"
        self.env = dict(os.environ, TRAINWARDEN_KAFKA=bootstrap, PYTHONPATH=str(ROOT / "pipeline"),
                        TRAINWARDEN_TOPIC_PREFIX=self.prefix, TRAINWARDEN_STORE=str(tmp / "store"))
        self.env.pop("TRAINWARDEN_SIGNING_KEY_FILE", None)
        self.env.pop("TRAINWARDEN_SIGNING_KEY", None)
        if signed:  # every service, the submitting client included, seals and verifies with one key
            self.env["TRAINWARDEN_SIGNING_KEY"] = secrets.token_hex(32)
        subprocess.run([*TRAINWARDEN, "kafka", "init", "--partitions", "4"], env=self.env, check=True,
                       capture_output=True, timeout=120)
        self.procs: dict[str, subprocess.Popen] = {}
        slots = math.ceil(width / agents)
        for index in range(agents):
            node = f"{self.prefix}-{index}"
            self._start(f"agent-{node}", "agent", "--node", node, "--slots", str(slots),
                        "--log-dir", str(tmp / f"logs-{node}"), "--address", "127.0.0.1")
        self._start("processor", "processor")
        self._start("actuator", "actuator", "--store", str(tmp / "store"), "--node-timeout", "10")

    def _start(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([*TRAINWARDEN, *args], env=self.env, cwd=self.tmp, stdout=log,
                                            stderr=subprocess.STDOUT)

    def peak_mib(self, name: str) -> float:
        for line in Path(f"/proc/{self.procs[name].pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.tmp / f"{name}.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"scale: {name} exited ({proc.returncode}); its log ends:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


PROCESS_KINDS = ("agents", "keepers", "instances", "broker", "processor", "actuator", "follower", "other")


def _cpu_by_process(services: Services, follower: int) -> dict[tuple[int, str], float]:
    """CPU seconds so far of every process on this machine, by (pid, kind).
    An instance that ended was reaped by its keeper, its CPU then in the
    keeper's children's time: counted there as the instances' (``_cpu_spent``)."""
    tick = os.sysconf("SC_CLK_TCK")
    named = {proc.pid: ("agents" if name.startswith("agent-") else name) for name, proc in services.procs.items()}
    named[follower] = "follower"
    seen: dict[int, tuple[int, float, float, bytes]] = {}  # pid: ppid, own, reaped children's, command
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        seen[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                                 (int(fields[13]) + int(fields[14])) / tick, command)
    keepers = {pid for pid, (ppid, _, _, command) in seen.items()
               if named.get(ppid) == "agents" and b"keeper.py" in command}
    spent: dict[tuple[int, str], float] = {}
    for pid, (ppid, own, children, command) in seen.items():
        if pid in keepers:
            spent[(pid, "keepers")] = own
            spent[(pid, "instances")] = children
            continue
        kind, parent = named.get(pid), ppid
        while kind is None and parent > 1:  # an instance's processes descend from a keeper
            kind = "instances" if parent in keepers else None
            parent = seen[parent][0] if parent in seen else 0
        if kind is None:
            kind = "broker" if command.split(b"\0", 1)[0].endswith(b"/java") and b"kafka" in command else "other"
        spent[(pid, kind)] = own + (children if kind == "instances" else 0.0)
    return spent


def _cpu_spent(before: dict[tuple[int, str], float], after: dict[tuple[int, str], float]) -> dict[str, float]:
    """CPU seconds by kind between two ``_cpu_by_process``. An instance that
    ended in between is in its keeper's children's time, whole: its part
    before is taken off. Another process that ended in between is left out."""
    totals = dict.fromkeys(PROCESS_KINDS, 0.0)
    for (pid, kind), value in after.items():
        totals[kind] += value - before.get((pid, kind), 0.0)
    for (pid, kind), value in before.items():
        if kind == "instances" and (pid, kind) not in after:
            totals[kind] -= value
    return totals


def _machine_busy_s() -> float:
    """CPU seconds this machine's cores have spent busy since boot (/proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def _times(directory: Path, prefix: str) -> dict[str, float]:
    """The stamps written whole so far (one being written reads empty: the next look has it)."""
    found = {}
    for path in directory.glob(prefix + "*"):
        text = path.read_text()
        if text.endswith("\n"):
            found[path.name] = float(text)
    return found


def _wait(what: str, predicate, timeout_s: float, services: Services) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        services.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"scale: timed out after {timeout_s:.0f} s waiting for {what}; logs in {services.tmp}")
        time.sleep(0.05)


def _records(bootstrap: str, prefix: str) -> list[tuple[str, float, object]]:
    """Every record of this run's topics: (topic kind, broker append time in s, the message as JSON)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             max_partition_fetch_bytes=16 * 1024 * 1024)
    partitions = [TopicPartition(topic, p) for topic in consumer.topics() if topic.startswith(prefix + ".")
                  for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    # Up to the ends as they are now: the agents go on heartbeating meanwhile.
    ends = {tp: end for tp, end in consumer.end_offsets(partitions).items() if end > 0}
    records = []
    while any(consumer.position(tp) < end for tp, end in ends.items()):
        for tp, batch in consumer.poll(timeout_ms=1000).items():
            for record in batch:
                if record.offset >= ends.get(tp, 0):
                    continue
                try:
                    message = json.loads(record.value)
                except (TypeError, ValueError):
                    message = {}
                if isinstance(message, dict) and message.get("tw_signed") == 1:
                    message = message.get("value")  # the services verified it; this only reads
                if not isinstance(message, dict):
                    message = {}
                records.append((record.topic.split(".", 1)[1], record.timestamp / 1000, message))
    consumer.close()
    return records


def measure(bootstrap: str, width: int, agents: int, keep: bool, pause: str = "builtin",
            signed: bool = False) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"tw-scale-{width}x{agents}-"))
    marks = tmp / "marks"
    marks.mkdir()
    print(f"scale: {width} instances on {agents} agents (logs in {tmp})", file=sys.stderr, flush=True)
    services = Services(bootstrap, tmp, width, agents, signed)
    try:
        time.sleep(4.0)  # every agent has joined and sent a heartbeat
        submitted = time.time()
        job_id = f"scale-{width}"
        submit = subprocess.Popen(
            [*TRAINWARDEN, "submit", "--follow", "--job-id", job_id, "--nproc", str(width),
             "--args", "--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=3",
             "--", *instance_command(pause, marks, width)],
            env=services.env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=open(tmp / "submit.log", "wb"))
        budget = 60 + width * 0.5
        _wait("every instance of round 0 to start", lambda: len(_times(marks, "start-0-")) >= width, budget, services)
        # What the job costs running, before any fault; then what the restart costs.
        steady = (_machine_busy_s(), time.monotonic(), _cpu_by_process(services, submit.pid))
        _wait("the crash", lambda: (marks / "crash").exists(), 60, services)
        restart = (_machine_busy_s(), time.monotonic(), _cpu_by_process(services, submit.pid))
        _wait("every instance of round 1 to start", lambda: len(_times(marks, "start-1-")) >= width, budget,
              services)
        done = (_machine_busy_s(), time.monotonic(), _cpu_by_process(services, submit.pid))
        steady_s, watched_s = max(restart[1] - steady[1], 1e-3), max(done[1] - restart[1], 1e-3)
        before = {kind: spent / steady_s for kind, spent in _cpu_spent(steady[2], restart[2]).items()}
        during = _cpu_spent(restart[2], done[2])
        peak = {name: services.peak_mib(name) for name in ("processor", "actuator")}
        try:
            code = submit.wait(budget)
        except subprocess.TimeoutExpired:
            submit.kill()
            code = None
        _wait("the crash stamp", lambda: "crash" in _times(marks, "crash"), 10, services)
        crash = _times(marks, "crash")["crash"]
        starts0 = _times(marks, "start-0-")
        starts1 = _times(marks, "start-1-")
        last_per_agent: dict[str, float] = {}
        for name, at in starts1.items():
            node = name.split("-", 3)[3]
            last_per_agent[node] = max(at, last_per_agent.get(node, 0.0))
        slowest = max(last_per_agent, key=last_per_agent.get)
        records = [r for r in _records(bootstrap, services.prefix) if r[1] >= crash - 1.0]
        window = [r for r in records if r[1] <= max(starts1.values()) + 0.5]
        decision = min((at for kind, at, m in records if kind == "decisions"), default=float("nan"))
        exits0 = {m.get("instance"): at for kind, at, m in records
                  if kind == "events" and m.get("type") == "instance_exited" and m.get("round") == 0}
        last_exit = max(exits0.values(), default=float("nan"))
        # Each node stops and starts its own instances: stages overlap across
        # nodes, so "start" is the longest from an instance's exit to its next start.
        rank_of = {name: name.split("-", 3)[2] for name in starts1}
        gaps = [at - exits0[f"worker-{rank_of[name]}"] for name, at in starts1.items()
                if f"worker-{rank_of[name]}" in exits0]
        return {
            "instances": width, "agents": agents, "signed": signed, "job_succeeded": code == 0,
            "round0_s": max(starts0.values()) - submitted,
            "crash_to_first_s": min(starts1.values()) - crash,
            "crash_to_all_s": max(starts1.values()) - crash,
            "decision_s": decision - crash,
            "stop_s": last_exit - decision,
            "start_s": max(gaps, default=float("nan")),
            "slowest_agent_s": last_per_agent[slowest] - crash,
            "fastest_agent_s": min(last_per_agent.values()) - crash,
            "busy_before_cores": (restart[0] - steady[0]) / steady_s, "machine_cpu_s": done[0] - restart[0],
            "busy_cores": (done[0] - restart[0]) / watched_s,
            "cores_before": before, "cpu_s": during,
            "processor_peak_mib": peak["processor"], "actuator_peak_mib": peak["actuator"],
            "messages": len(window), "commands": sum(1 for kind, _, _ in window if kind == "commands"),
        }
    finally:
        services.stop()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


# Tables narrower than a terminal: the restart's times; what it cost; by process, the
# cores the running job kept busy before the crash and the CPU seconds of the restart.
TIMES = (("instances", "inst", "{:d}"), ("agents", "agents", "{:d}"), ("round0_s", "round 0", "{:.2f}"),
         ("crash_to_first_s", "first", "{:.2f}"), ("crash_to_all_s", "all", "{:.2f}"),
         ("decision_s", "decide", "{:.2f}"), ("stop_s", "stop", "{:.2f}"), ("start_s", "start", "{:.2f}"),
         ("slowest_agent_s", "slow ag", "{:.2f}"))
COSTS = (("instances", "inst", "{:d}"), ("busy_before_cores", "before", "{:.2f}"),
         ("machine_cpu_s", "all cpu", "{:.2f}"), ("busy_cores", "busy", "{:.2f}"),
         ("processor_peak_mib", "proc MiB", "{:.0f}"), ("actuator_peak_mib", "act MiB", "{:.0f}"),
         ("messages", "msgs", "{:d}"), ("commands", "cmds", "{:d}"))


KIND_TITLES = {"processor": "proc", "actuator": "act"}  # as in the costs table: 76 columns in all


def _by_kind(key: str):
    return (("instances", "inst", "{:d}"),
            *((f"{key}.{kind}", KIND_TITLES.get(kind, kind), "{:.2f}") for kind in PROCESS_KINDS))


def _table_line(columns, row: Optional[dict] = None) -> str:
    if row is None:
        return "  ".join(f"{title:>{max(len(title), 6)}}" for _, title, _ in columns)

    def value(key: str):
        outer, _, inner = key.partition(".")
        return row[outer][inner] if inner else row[outer]

    return "  ".join(f"{fmt.format(value(key)):>{max(len(title), 6)}}" for key, title, fmt in columns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16x2,128x4,512x8,1024x16",
                        help="comma-separated INSTANCESxAGENTS (default 16x2,128x4,512x8,1024x16)")
    parser.add_argument("--bootstrap", default=os.environ.get("TRAINWARDEN_KAFKA"))
    parser.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    parser.add_argument("--keep", action="store_true", help="keep each size's directory (services' logs)")
    parser.add_argument("--pause", choices=sorted(PAUSES), default="builtin",
                        help="how instances wait between lines: bash's read (default) or /bin/sleep, a process "
                             "each time (the issue's first measurement)")
    parser.add_argument("--signed", action="store_true",
                        help="sign every message with a key made for the run (as a cluster off loopback must)")
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("no broker: set TRAINWARDEN_KAFKA or pass --bootstrap (deploy/kafka/local-kafka start)")
    sizes = [_size(part) for part in args.sizes.split(",") if part]
    print(f"machine: {os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}",
          file=sys.stderr)
    if not args.json:
        print(_table_line(TIMES))
    rows = []
    for width, agents in sizes:
        row = measure(args.bootstrap, width, agents, args.keep, args.pause, args.signed)
        rows.append(row)
        print(json.dumps(row) if args.json else _table_line(TIMES, row), flush=True)
        if not row["job_succeeded"]:
            print(f"scale: the {width}-instance job did not succeed", file=sys.stderr)
    if not args.json:
        for title, columns in (("", COSTS), ("cores busy before the crash, by process", _by_kind("cores_before")),
                               ("CPU seconds from the crash to all started, by process", _by_kind("cpu_s"))):
            print(f"\n{title}" if title else "")
            print(_table_line(columns))
            for row in rows:
                print(_table_line(columns, row))
    print("times in seconds: round 0 = submit -> all started; first/all = crash -> round 1 started; "
          "decide = crash -> decision, stop = decision -> last exit, start = the longest from an instance's "
          "exit to its next start. before = cores busy from round 0 all started to the "
          "crash; all cpu = the machine's CPU seconds from the crash to all started, busy = its cores busy "
          "(docs/PERFORMANCE.md)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
