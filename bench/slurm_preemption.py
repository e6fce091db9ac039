"""A job preempted on a real Slurm cluster, and back: Trainwarden beside
Slurm's own requeue.

On the local cluster (deploy/slurm/local-slurm: partition ``urgent``
preempts ``debug``, PreemptMode=REQUEUE), a job runs on two nodes; an
exclusive job of ``urgent`` on every node (``sleep 4``) preempts it. For each
run, seconds:

- Trainwarden (``trainwarden submit --runtime slurm``, the services as
  processes on a real broker, job restarts off): from the urgent job's
  submission to Slurm's SIGTERM reaching the tasks, to Trainwarden's
  decision (``restart_job``, reason ``preempted``), and from the urgent job's
  end to both instances running again (their round-1 output);
- Slurm alone (``sbatch --requeue`` of the same two tasks): from the urgent
  job's end to the requeued job running again (Slurm holds a requeued job
  for about 120 s, ``Reason=BeginTime``).

    eval "$(deploy/slurm/local-slurm start)"; export TRAINWARDEN_KAFKA=127.0.0.1:9092
    .venv/bin/python bench/slurm_preemption.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "pipeline"))

from tests.cluster.processes import ServiceProcesses  # noqa: E402
from tests.scenarios.runtimes import PROGRAM, cancel_slurm_jobs  # noqa: E402

URGENT_S = 4
SLURM_ALONE_CAP_S = 300.0


def _slurm(*args: str) -> str:
    return subprocess.run(list(args), check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def _until(condition, timeout: float, what: str, every: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"bench: gave up waiting for {what} after {timeout:.0f} s")


def _urgent(name: str) -> str:
    return _slurm("sbatch", "--parsable", "-p", "urgent", "-N3", "--exclusive", f"--job-name={name}",
                  "--output=/dev/null", "--wrap", f"sleep {URGENT_S}")


def _gone(job: str) -> bool:
    return not _slurm("squeue", "-h", "-j", job, "-o", "%i")


def trainwarden_run(bootstrap: str, tmp: Path) -> dict:
    job_id = f"pre-{uuid.uuid4().hex[:6]}"
    services = ServiceProcesses(bootstrap, tmp, slurm_dir=tmp / "slurm")
    try:
        definition = tmp / "job.yaml"
        definition.write_text(json.dumps({
            "job_id": job_id, "args": "--enable-job-restart=False", "stop_grace_s": 2,
            "checkpoint_dir": str(tmp / "checkpoints"),
            "roles": {"worker": {"count": 2, "command": [sys.executable, PROGRAM, "--steps", "120",
                                                        "--step-s", "0.25"]}}}))
        proc = services.submit(str(definition), "--runtime", "slurm")

        def logs(round_: int) -> list[Path]:
            return [p for node in services.node_names
                    for p in (tmp / f"logs-{node}" / job_id).glob(f"*/r{round_}-*.log")]

        _until(lambda: len(logs(0)) == 2, 90, "round 0 running", every=0.2)
        time.sleep(2)
        urgent_name = f"tw-{job_id}-urgent"
        submitted = time.time()
        urgent = _urgent(urgent_name)
        try:
            sigterm = _until(lambda: any("sigterm: " in p.read_text(errors="replace") for p in logs(0)) and time.time(),
                             60, "the SIGTERM")
            ended = _until(lambda: _gone(urgent) and time.time(), 120, "the urgent job's end", every=0.1)
            again = _until(lambda: len(logs(1)) == 2 and time.time(), 120, "round 1 running")
        finally:
            subprocess.run(["scancel", "--quiet", f"--name={urgent_name}"], check=False)
        proc.communicate(timeout=240)
        records = [r for r in services.history(job_id) if r["reason"] == "preempted"]
        if proc.returncode != 0 or len(records) != 1:
            raise SystemExit(f"bench: the job did not end as it should (exit {proc.returncode}, records {records})")
        return {"sigterm_s": sigterm - submitted, "decision_s": records[0]["time"] - submitted,
                "running_again_s": again - ended}
    finally:
        services.stop()
        cancel_slurm_jobs(job_id)


def slurm_alone_run(tmp: Path) -> dict:
    name = f"plain-{uuid.uuid4().hex[:6]}"
    script = tmp / "plain.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'trap \"exit 143\" TERM; while true; do sleep 0.2; done'\n")
    script.chmod(0o755)
    job = _slurm("sbatch", "--parsable", "--requeue", "-N2", "-n2", f"--job-name={name}", "--output=/dev/null",
                 str(script))

    def state() -> tuple[str, int]:
        record = dict(field.split("=", 1) for field in _slurm("scontrol", "show", "job", "-o", job).split()
                      if "=" in field)
        return record.get("JobState", ""), int(record.get("Restarts", "0"))

    try:
        _until(lambda: state()[0] == "RUNNING", 60, "the plain job running", every=0.2)
        time.sleep(2)
        urgent_name = f"{name}-urgent"
        urgent = _urgent(urgent_name)
        _until(lambda: state()[1] == 1, 60, "Slurm's requeue")
        ended = _until(lambda: _gone(urgent) and time.time(), 120, "the urgent job's end", every=0.1)
        again = _until(lambda: state() == ("RUNNING", 1) and time.time(), SLURM_ALONE_CAP_S,
                       "the requeued plain job running again", every=0.5)
        return {"running_again_s": again - ended}
    finally:
        subprocess.run(["scancel", "--quiet", job], check=False)
        subprocess.run(["scancel", "--quiet", f"--name={name}-urgent"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (median)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not os.environ.get("SLURM_CONF") or not bootstrap:
        print("bench: needs a Slurm cluster and a broker: eval \"$(deploy/slurm/local-slurm start)\" and "
              "export TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {"trainwarden": [], "slurm": []}
    for index in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="tw-bench-preempt-") as raw:
            runs["trainwarden"].append(trainwarden_run(bootstrap, Path(raw)))
            print(f"run {index + 1}/{args.repeat}: trainwarden {runs['trainwarden'][-1]}", file=sys.stderr)
            runs["slurm"].append(slurm_alone_run(Path(raw)))
            print(f"run {index + 1}/{args.repeat}: slurm alone {runs['slurm'][-1]}", file=sys.stderr)
    median = {who: {key: round(statistics.median(r[key] for r in results), 2) for key in results[0]}
              for who, results in runs.items()}
    if args.json:
        print(json.dumps({"runs": args.repeat, "median": median}))
        return 0
    tw, alone = median["trainwarden"], median["slurm"]
    print(f"Preempted by an exclusive urgent job ({URGENT_S} s) on the local Slurm; median of {args.repeat} runs, "
          f"seconds\n")
    print("| | urgent submitted -> SIGTERM | -> decision | urgent ended -> running again |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| Trainwarden | {tw['sigterm_s']:.2f} | {tw['decision_s']:.2f} | {tw['running_again_s']:.2f} |")
    print(f"| Slurm alone (`sbatch --requeue`) | - | - | {alone['running_again_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
