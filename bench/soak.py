"""A chaos soak of the Kafka cluster shape (issue 26, item 4): random faults
on wide jobs for many minutes, then a check that no decision was lost or
doubled.

Real services as processes on this machine (tests/cluster/processes.py and
takeover.py): ``--agents`` agents, two processors, an actuator, a notifier
whose subscription posts to a local webhook receiver. Jobs of ``--instances``
light ``bash`` instances (Sync mode, a line a second) run one after another;
while one runs, the soak injects 2-4 faults at random, waiting each time
until the job runs steadily again:

  crash        one rank exits with a retryable NCCL error (a restart is due)
  hang         every rank goes silent (job_hang after --hang-interval s)
  agent        SIGKILL of one agent, started again at once
  processor    SIGKILL of one of the two processors, started again 0.1-2 s later
  actuator     SIGKILL of the actuator, started again 0.1-2 s later
  notifier     SIGKILL of the notifier, started again 0.1-2 s later
  broker       the broker stopped 5-15 s and started again (only with
               --broker-data-dir, a deploy/kafka/local-kafka broker the soak
               may restart; never give it a shared broker)
(a service kill comes with a crash at the same moment half the time), and
then ends the job: every rank exits 0 (it must succeed), or for about one
job in four one rank fails with a persistent error in every round (it must
fail). When the minutes are up, the soak reads the decisions topic, the
actuator's records, the history and the webhooks received, and
bench/soak_check.py judges them: lost and doubled decisions by action id,
history rows against decisions, each webhook once per id, each job's
outcome, processes of a job left after it ended.

    .venv/bin/python bench/soak.py [--minutes 30] [--instances 64] [--agents 8] [--seed N]
        [--hang-interval 10] [--bootstrap HOST:PORT] [--broker-data-dir DIR] [--keep] [--json]

Exit 0 when the check finds nothing, 1 when it finds something (the run's
directory, logs and records.json, is then kept). Not a test, not in CI:
docs/PERFORMANCE.md quotes its figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale import _records  # noqa: E402
from bench.soak_check import DecisionSeen, HistoryRow, JobSeen, Records, WebhookSeen, check  # noqa: E402
from tests.cluster.processes import KAFKA_SCRIPT  # noqa: E402
from tests.cluster.takeover import NCCL, Services, wait_for  # noqa: E402
from tests.conftest import TRAINWARDEN, job_processes  # noqa: E402
from tests.notify.conftest import ENV, subscription_yaml  # noqa: E402
from tests.notify.receiver import Receiver  # noqa: E402

PERSISTENT = "ModuleNotFoundError: No module named 'transformerz'"
# $1: the job's control directory. Files the soak writes there steer it:
# crash-R (a rank) crashes that rank in round R with a retryable error,
# persistent (a rank) crashes it in every round with a persistent one,
# hush-R silences round R, finish ends every rank with 0. Every incarnation
# appends its pid to start-RANK-ROUND-START (bash builtins only: no fork a line).
INSTANCE = r"""
d="$1"; r="$TRAINWARDEN_RESTART_ROUND"; s="${TRAINWARDEN_INSTANCE_RESTARTS:-0}"
exec 9<> <(:)
printf '%s\n' "$$" >> "$d/start-$RANK-$r-$s"
i=0
while :; do
  [ -e "$d/finish" ] && { echo "done after $i steps"; exit 0; }
  if [ -e "$d/persistent" ]; then read -r p < "$d/persistent"; [ "$p" = "$RANK" ] && { echo "PERSISTENT" >&2; exit 1; }; fi
  if [ -e "$d/crash-$r" ]; then read -r c < "$d/crash-$r"; [ "$c" = "$RANK" ] && { echo "NCCL" >&2; exit 1; }; fi
  [ -e "$d/hush-$r" ] || echo "step $i"
  i=$((i + 1)); read -t 1 -u 9 || :
done
""".replace("PERSISTENT", PERSISTENT).replace("NCCL", NCCL)
KINDS = ("crash", "hang", "agent", "processor", "actuator", "notifier", "broker")
WEIGHTS = {"crash": 3, "hang": 1, "agent": 2, "processor": 2, "actuator": 2, "notifier": 1, "broker": 1}
NODE_TIMEOUT_S = 10.0


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp
        self.rng = random.Random(args.seed)
        self.began = time.monotonic()
        self.faults: Counter = Counter()
        self.recovery: dict[str, list[float]] = {}
        self.notifier_kills: list[float] = []
        self.isolations = 0  # nodes the engine isolated (and the soak uncordoned after the job)
        self.jobs: list[dict] = []
        self.hook = Receiver()
        # Room for a job with two nodes isolated (the engine isolates a node
        # whose instances keep failing): without it the job waits for capacity.
        slots = math.ceil(args.instances / max(1, args.agents - 2))
        self.services = Services(args.bootstrap, tmp, nodes=args.agents, slots=slots, node_timeout_s=NODE_TIMEOUT_S)
        self.services.start_second_processor()
        wait_for(self.services.settled, 120, "two processors holding two events partitions each")
        subscriptions = tmp / "notifications"
        subscriptions.mkdir()
        (subscriptions / "soak.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
            "soak", self.hook.url, private=True, retry="{max_attempts: 60, backoff_s: 0.5, max_backoff_s: 2.0}"))
        self.services.env.update(ENV)
        self.start_notifier()

    # ---------------------------------------------------------------- services

    def start_notifier(self) -> None:
        self.services.start("notifier", "--notifications", str(self.tmp / "notifications"), "--notify-dir",
                            str(self.tmp / "notify-queue"), "--store", str(self.services.store))

    def restart(self, name: str) -> None:
        """SIGKILL, then started again as a service manager does (agents at once, the rest 0.1-2 s later)."""
        if name == "notifier":
            self.notifier_kills.append(time.monotonic())
        self.services.kill(name)
        if not name.startswith("agent-"):
            time.sleep(self.rng.uniform(0.1, 2.0))
        self.start_again(name)

    def start_again(self, name: str) -> None:
        if name.startswith("agent-"):
            self.services.start_agent(name[len("agent-"):])
        elif name == "processor-b":
            self.services.start_second_processor()
        elif name == "notifier":
            self.start_notifier()
        else:
            self.services.start(name)

    def broker(self, command: str) -> None:
        env = dict(os.environ, KAFKA_PORT=self.args.bootstrap.rsplit(":", 1)[1],
                   KAFKA_DATA_DIR=self.args.broker_data_dir)
        subprocess.run([str(self.args.kafka_script), command], env=env, check=True, capture_output=True, timeout=180)

    def revive(self) -> None:
        """A service that died by itself (not by the soak) is started again, and said so."""
        for name, proc in list(self.services.procs.items()):
            if proc.poll() is None:
                continue
            self.say(f"{name} exited by itself ({proc.returncode}); started again")
            self.faults[f"died:{name.split('-')[0]}"] += 1
            self.start_again(name)

    # -------------------------------------------------------------------- jobs

    def say(self, text: str) -> None:
        if not self.args.json:
            elapsed = time.monotonic() - self.began
            print(f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] {text}", flush=True)

    def rounds(self, work: Path) -> tuple[int, int]:
        """(the newest round every rank has started, the newest round any rank has started); -1 before any."""
        ranks: dict[int, set[int]] = {}
        for path in work.glob("start-*"):
            _, rank, round_, _ = path.name.split("-")
            ranks.setdefault(int(round_), set()).add(int(rank))
        complete = [r for r, seen in ranks.items() if len(seen) >= self.args.instances]
        return max(complete, default=-1), max(ranks, default=-1)

    def wait_round(self, work: Path, after: int, timeout_s: float) -> float | None:
        """Seconds until every rank runs a round newer than ``after``; None on timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.rounds(work)[0] > after:
                return time.monotonic() - start
            self.revive()
            time.sleep(0.25)
        return None

    def steady(self, work: Path, timeout_s: float = 180) -> int:
        """Wait until every rank runs the newest round any rank started; that round."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            complete, newest = self.rounds(work)
            if complete >= 0 and complete == newest:
                return complete
            self.revive()
            time.sleep(0.25)
        return self.rounds(work)[0]

    def write(self, path: Path, text: str) -> None:
        part = path.with_suffix(".part")
        part.write_text(text + "\n")
        part.replace(path)

    def crash(self, work: Path, round_: int) -> None:
        self.write(work / f"crash-{round_}", str(self.rng.randrange(self.args.instances)))

    def fault(self, kind: str, work: Path, round_: int) -> str:
        """Inject one fault; what it was, for the progress line. Returns after
        the job runs steadily again (or the wait for it timed out)."""
        self.faults[kind] += 1
        with_crash = False
        if kind == "crash":
            self.crash(work, round_)
            what = "retryable crash"
        elif kind == "hang":
            self.write(work / f"hush-{round_}", "")
            what = "every rank silent"
        elif kind == "broker":
            self.broker("stop")
            down = self.rng.uniform(5, 15)
            with_crash = self.rng.random() < 0.5
            if with_crash:
                self.crash(work, round_)
            time.sleep(down)  # the outage's length
            self.broker("start")
            what = f"broker down {down:.0f} s"
        else:
            name = {"agent": f"agent-{self.rng.choice(self.services.node_names)}",
                    "processor": self.rng.choice(("processor", "processor-b"))}.get(kind, kind)
            with_crash = self.rng.random() < 0.5
            if with_crash:
                self.crash(work, round_)
            self.restart(name)
            what = f"SIGKILL {name}"
        if kind in ("crash", "hang") or with_crash:
            what += " + crash" if with_crash else ""
            took = self.wait_round(work, round_, 60 + 3 * self.args.hang_interval)
            self.recovery.setdefault(kind, []).append(took if took is not None else float("nan"))
            what += f" -> round {round_ + 1} in {took:.1f} s" if took is not None else " -> NO new round in time"
        elif kind == "agent":
            # Re-adopted, or lost after the node timeout and the job restarted: either is right.
            took = self.wait_round(work, round_, NODE_TIMEOUT_S + 10)
            what += f" -> round {round_ + 1} in {took:.1f} s" if took is not None else " -> same round"
        self.steady(work)
        return what

    def run_job(self, number: int) -> None:
        job_id = f"soak-{self.args.run_id}-{number}"
        work = self.tmp / "work" / job_id
        work.mkdir(parents=True)
        persistent = self.rng.random() < 0.25
        faults = self.rng.choices([k for k in KINDS if k != "broker" or self.args.broker_data_dir],
                                  weights=[WEIGHTS[k] for k in KINDS if k != "broker" or self.args.broker_data_dir],
                                  k=self.rng.randint(2, 4))
        # The no-progress guard off: faults seconds apart make rounds far shorter than
        # the rule pack's progress_min_run_s, and a retryable crash repeated in them would
        # fail the job (no_progress), an outcome the soak does not plan.
        args = (f"--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=100 "
                f"--max-num-of-no-progress-restart=-1 --enable-job-hang-detection=True "
                f"--job-hang-interval={self.args.hang_interval}")
        command = ["bash", "-c", INSTANCE, "instance", str(work)]
        submitted = time.monotonic()
        subprocess.run([*TRAINWARDEN, "submit", "--job-id", job_id, "--nproc", str(self.args.instances),
                        "--args", args, "--", *command], env=self.services.env, cwd=ROOT, check=True,
                       capture_output=True, timeout=120)
        round_ = self.steady(work, 300)
        self.say(f"job {number} {job_id}: round 0 of {self.args.instances} running in "
                 f"{time.monotonic() - submitted:.1f} s; faults {', '.join(faults)}"
                 f"{', then a persistent error' if persistent else ''}")
        for kind in faults:
            time.sleep(self.rng.uniform(2, 8))  # the job runs a while between faults
            what = self.fault(kind, work, round_)
            round_ = self.rounds(work)[0]
            self.say(f"job {number}: {what}")
            if "NO new round" in what and self.job_record(job_id).get("status") not in (None, "running"):
                break  # over already: the outcome check says whether it should be
        expected = "failed" if persistent else "succeeded"
        if persistent:
            self.write(work / "persistent", str(self.rng.randrange(self.args.instances)))
        else:
            self.write(work / "finish", "")
        status, reason = self.outcome(job_id, 300)
        orphans = self.orphans(job_id)
        isolated = self.uncordon(job_id)
        self.jobs.append({"job_id": job_id, "work": str(work), "expected": expected, "status": status,
                          "reason": reason, "faults": faults, "orphans": orphans})
        self.say(f"job {number}: {status or 'NO OUTCOME'} ({reason}), expected {expected}; "
                 f"{self.rounds(work)[1] + 1} rounds" + (f"; uncordoned {', '.join(isolated)}" if isolated else "")
                 + (f"; ORPHANS {orphans}" if orphans else ""))

    def uncordon(self, job_id: str) -> list[str]:
        """Nodes the engine isolated during the job, made ready again as an
        operator would: the next job has the whole cluster."""
        out = subprocess.run([*TRAINWARDEN, "history", "--job", job_id, "--json", "--store",
                              str(self.services.store)], env=self.services.env, cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        nodes = sorted({r["node_name"] for r in rows if r["action"] == "isolate_node" and r["node_name"]})
        for node in nodes:
            self.isolations += 1
            subprocess.run([*TRAINWARDEN, "nodes", "uncordon", node], env=self.services.env, cwd=ROOT,
                           capture_output=True, timeout=120)
        return nodes

    def job_record(self, job_id: str) -> dict:
        out = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--json", "--store", str(self.services.store)],
                             env=self.services.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        return next((row for row in rows if row.get("job_id") == job_id), {})

    def outcome(self, job_id: str, timeout_s: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.job_record(job_id)
            if record.get("status") in ("succeeded", "failed"):
                return record["status"], record.get("reason", "")
            self.revive()
            time.sleep(1.0)
        record = self.job_record(job_id)
        return record.get("status", ""), record.get("reason", "")

    def orphans(self, job_id: str, grace_s: float = 30) -> list[str]:
        """Processes of a job still alive ``grace_s`` after its outcome (then killed, so the next job has the CPU)."""
        deadline = time.monotonic() + grace_s
        left = job_processes(job_id + "\x00")
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = job_processes(job_id + "\x00")
        found = [f"{pid} {job_id}: {cmdline[:60]}" for pid, cmdline in left]
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return found

    # ------------------------------------------------------------------ check

    def collect(self) -> Records:
        from trainwarden.bus.base import DECISIONS
        from trainwarden.bus.serde import decode
        from trainwarden.events import Decision
        from trainwarden.notify.events import event_id, event_types_for

        decided, done, expected_hooks = [], [], {}
        for kind, _, message in _records(self.args.bootstrap, self.services.topic_prefix):
            if kind == "decisions" and message.get("type") == "decision":
                decision = decode(DECISIONS, json.dumps(message).encode())
                assert isinstance(decision, Decision)
                decided.append(DecisionSeen(decision.action_id, decision.job_id, decision.kind.value, decision.round))
                for event_type in event_types_for(decision):
                    expected_hooks[event_id(decision.action_id, event_type)] = decision.action_id
            elif kind == "actuator" and message.get("type") == "action_done":
                done.append((message["action_id"], message["job_id"]))
        out = subprocess.run([*TRAINWARDEN, "history", "--json", "--wide", "--store", str(self.services.store)],
                             env=self.services.env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        history = [HistoryRow(r["record_id"], r["job_id"], r["action"], r["result"]) for r in rows]
        jobs = []
        for job in self.jobs:
            starts: Counter = Counter()
            for path in Path(job["work"]).glob("start-*"):
                _, rank, round_, start = path.name.split("-")
                starts[(int(rank), int(round_), int(start))] = len(path.read_text().split())
            jobs.append(JobSeen(job["job_id"], job["expected"], job["status"], job["reason"],
                                "non_retryable_failure" if job["expected"] == "failed" else "", dict(starts)))
        hooks = [WebhookSeen(r.webhook_id, r.at) for r in self.hook.requests]
        orphans = [o for job in self.jobs for o in job["orphans"]]
        return Records(tuple(decided), tuple(done), tuple(history), tuple(jobs), tuple(hooks), expected_hooks,
                       tuple(self.notifier_kills), tuple(orphans))

    def close(self) -> list[str]:
        """Stop the services; processes of the soak's jobs still alive after."""
        self.services.stop()
        self.hook.close()
        left = job_processes(f"soak-{self.args.run_id}-")
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return [f"{pid}: {cmdline[:60]}" for pid, cmdline in left]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="new jobs start until then (default 30)")
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None, help="the faults' random seed (default: a new one)")
    parser.add_argument("--hang-interval", type=int, default=10, help="the jobs' --job-hang-interval (default 10)")
    parser.add_argument("--bootstrap", default=os.environ.get("TRAINWARDEN_KAFKA", ""))
    parser.add_argument("--broker-data-dir", default="",
                        help="KAFKA_DATA_DIR of the deploy/kafka/local-kafka broker at --bootstrap: enables broker "
                             "restarts (never a broker others use)")
    parser.add_argument("--kafka-script", type=Path, default=KAFKA_SCRIPT,
                        help="the local-kafka script that stops and starts it (default deploy/kafka/local-kafka)")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory even when all is well")
    parser.add_argument("--json", action="store_true", help="the figures as one JSON object, no progress lines")
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("no broker: set TRAINWARDEN_KAFKA or pass --bootstrap (deploy/kafka/local-kafka start)")
    if not 1 <= args.agents <= args.instances <= 4096:
        parser.error("--agents and --instances: need 1 <= agents <= instances <= 4096")
    if args.broker_data_dir:
        env = dict(os.environ, KAFKA_PORT=args.bootstrap.rsplit(":", 1)[1], KAFKA_DATA_DIR=args.broker_data_dir)
        status = subprocess.run([str(args.kafka_script), "status"], env=env, capture_output=True, timeout=60)
        if status.returncode != 0:
            parser.error(f"--broker-data-dir: no local-kafka broker of {args.broker_data_dir} answers at "
                         f"{args.bootstrap} (hint: start one with KAFKA_PORT and KAFKA_DATA_DIR set)")
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    args.run_id = uuid.uuid4().hex[:6]
    tmp = Path(tempfile.mkdtemp(prefix="tw-soak-"))
    load_before = _load()
    if not args.json:
        print(f"soak: seed {args.seed}, {args.instances} instances on {args.agents} agents, {args.minutes:g} min; "
              f"load {load_before}; logs in {tmp}", flush=True)
    soak = Soak(args, tmp)
    number = 0
    try:
        while time.monotonic() - soak.began < args.minutes * 60:
            number += 1
            soak.run_job(number)
        time.sleep(10)  # the last webhooks' retries
        records = soak.collect()
    finally:
        left = soak.close()
    verdict = check(records)
    (tmp / "records.json").write_text(json.dumps(_plain(records), indent=1))
    figures = {
        "seed": args.seed, "instances": args.instances, "agents": args.agents,
        "minutes": round((time.monotonic() - soak.began) / 60, 1), "load_before": load_before, "load_after": _load(),
        "faults": dict(soak.faults),
        "recovery_median_s": {k: round(statistics.median(v), 1) for k, v in soak.recovery.items() if v},
        "nodes_isolated": soak.isolations, "jobs": len(soak.jobs), "outcomes": dict(Counter(f"{j['expected']}->{j['status'] or 'none'}"
                                                          for j in soak.jobs)),
        "decisions": verdict.decisions, "executed": verdict.executed, "republished": verdict.republished,
        "history_rows": verdict.history_rows, "webhooks_expected": verdict.webhooks_expected,
        "webhooks_delivered": verdict.webhooks_delivered, "webhooks_redelivered_after_kill": verdict.redelivered,
        "lost": [vars(f) for f in verdict.lost], "doubled": [vars(f) for f in verdict.doubled],
        "wrong_outcomes": [vars(f) for f in verdict.wrong_outcomes],
        "orphans": [vars(f) for f in verdict.orphans] + [{"what": "left after the end", "subject": o} for o in left],
        "directory": str(tmp),
    }
    ok = verdict.ok and not left
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        _table(figures)
    if ok and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    elif not args.json:
        print(f"soak: the run's logs and records.json are kept in {tmp}")
    return 0 if ok else 1


def _plain(records: Records) -> dict:
    import dataclasses

    plain = dataclasses.asdict(records)
    plain["jobs"] = [dict(job, starts={"-".join(map(str, k)): v for k, v in job["starts"].items()})
                     for job in plain["jobs"]]
    return plain


def _table(figures: dict) -> None:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(figures["faults"].items()))
    recovery = ", ".join(f"{k} {v} s" for k, v in sorted(figures["recovery_median_s"].items()))
    rows = [
        ("run", f"{figures['minutes']} min, seed {figures['seed']}, {figures['instances']} instances on "
                f"{figures['agents']} agents, load {figures['load_before']} -> {figures['load_after']}"),
        ("faults", f"{sum(figures['faults'].values())}: {faults}"),
        ("fault -> new round", f"median {recovery}"),
        ("nodes isolated", f"{figures['nodes_isolated']} by the engine (uncordoned after their job)"),
        ("jobs", f"{figures['jobs']}: " + ", ".join(f"{k} {v}" for k, v in sorted(figures["outcomes"].items()))),
        ("decisions", f"{figures['decisions']} (executed {figures['executed']}, published again under the same id "
                      f"{figures['republished']})"),
        ("history rows", str(figures["history_rows"])),
        ("webhooks", f"{figures['webhooks_delivered']} of {figures['webhooks_expected']} delivered, "
                     f"{figures['webhooks_redelivered_after_kill']} again after a notifier kill"),
        ("lost", str(len(figures["lost"]))), ("doubled", str(len(figures["doubled"]))),
        ("wrong outcomes", str(len(figures["wrong_outcomes"]))), ("orphans", str(len(figures["orphans"]))),
    ]
    for name, value in rows:
        print(f"{name:<20} {value}")
    for key in ("lost", "doubled", "wrong_outcomes", "orphans"):
        for finding in figures[key][:20]:
            print(f"  {key}: {finding.get('what')} {finding.get('subject')} {finding.get('detail', '')}")


if __name__ == "__main__":
    sys.exit(main())
