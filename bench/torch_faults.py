"""The same real PyTorch job and the same faults under Trainwarden and under
torchrun, side by side (tests/torch/programs/ddp_train.py: gloo on CPU,
3 ranks, DDP, a checkpoint every 5 steps, 30 steps).

For each fault and launcher: whether the fault was acted on, seconds from the
fault to the decision, seconds from the fault to every rank training again
(its first step after the restart), restarts that could not help, wall time.

    .venv/bin/python bench/torch_faults.py [--hang-cap 120]

Trainwarden: `trainwarden run` with 3 instances, --enable-job-restart=True,
hang detection with an 8 s interval, ExitCodeAndErrorMsg. torchrun: stock
`torch.distributed.run --standalone --nproc-per-node 3 --max-restarts 3`,
with the job's per-attempt PrefixStore (stock torchrun cannot restart a gloo
job otherwise: the new attempt meets the old addresses in the store).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "torch" / "programs" / "ddp_train.py"
TRAINWARDEN = [sys.executable, "-m", "trainwarden.cli.main"]
ARGS = ("--enable-job-restart=True --max-num-of-job-restart=3 --enable-job-hang-detection=True "
        "--job-hang-interval=8")
FAULTS = (
    ("sigkill", "SIGKILL of rank 1", True),
    ("kill_in_collective", "rank 1 killed inside a large all_reduce", True),
    ("hang", "rank 1 silent before its all_reduce", True),
    ("early_exit", "rank 1 exits 0 early", True),
    ("shape_error", "persistent shape error on rank 1", False),
)
_LINE = re.compile(r"(?P<what>.*?) rank=(?P<rank>\d+) round=(?P<round>\d+) t=(?P<t>\d+\.\d+)")
_GLOG = re.compile(r"^[IWE]\d{4} (?P<hms>\d\d:\d\d:\d\d\.\d+) .*(Sending process \d+ closing signal|"
                   r"Restarting workers|failed \(exitcode)")


def parse(output: str) -> dict:
    fault_t = None
    first_step_after: dict[int, float] = {}
    rounds = set()
    decision_t = None
    for raw in output.splitlines():
        line = re.sub(r"^\[[\w-]+\]:?\s*", "", raw)
        match = _LINE.search(line)
        if match:
            t, rank, round_ = float(match["t"]), int(match["rank"]), int(match["round"])
            rounds.add(round_)
            if match["what"].startswith("injecting") and fault_t is None:
                fault_t = t
            elif match["what"].startswith("step") and round_ > 0 and rank not in first_step_after:
                first_step_after[rank] = t
            continue
        glog = _GLOG.search(line)
        if glog and decision_t is None and fault_t is not None:
            day = datetime.datetime.fromtimestamp(fault_t, datetime.timezone.utc).date()
            moment = datetime.datetime.combine(day, datetime.time.fromisoformat(glog["hms"]),
                                               tzinfo=datetime.timezone.utc)
            decision_t = moment.timestamp()
    return {"fault_t": fault_t, "again_t": max(first_step_after.values()) if len(first_step_after) == 3 else None,
            "rounds": rounds, "decision_t": decision_t}


_READY = re.compile(r"process group ready rank=(?P<rank>\d+) round=(?P<round>\d+) t=(?P<t>\d+\.\d+)")


def ready_again(output: str) -> Optional[float]:
    """When the last rank's process group was ready again after the restart."""
    times: dict[int, float] = {}
    for line in output.splitlines():
        match = _READY.search(line)
        if match and int(match["round"]) > 0:
            times.setdefault(int(match["rank"]), float(match["t"]))
    return max(times.values()) if len(times) == 3 else None


def run_trainwarden(fault: str, tmp: Path, cap: float, preload: str = "", extra: tuple = ()) -> dict:
    job_id = f"bench-{fault}-{int(time.time())}"
    store = tmp / "store"
    checkpoints = tmp / f"{job_id}-ckpt"
    checkpoints.mkdir()
    job = tmp / f"{job_id}.yaml"
    job.write_text(textwrap.dedent(f"""
        job_id: {job_id}
        framework: pytorch
        args: {ARGS}
        stop_grace_s: 5
        checkpoint_dir: {checkpoints}
        preload: {json.dumps([m for m in preload.split(",") if m])}
        roles:
          worker:
            count: 3
            command: {json.dumps([sys.executable, str(PROGRAM), "--result", str(tmp / (job_id + ".json")),
                                  "--fault", fault, *extra])}
    """))
    env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"))
    started = time.time()
    proc = subprocess.run([*TRAINWARDEN, "run", str(job)], capture_output=True, text=True, env=env, timeout=cap + 120)
    wall = time.time() - started
    facts = parse(proc.stdout + proc.stderr)
    facts["ready_t"] = ready_again(proc.stdout + proc.stderr)
    records = json.loads(subprocess.run([*TRAINWARDEN, "history", "--job", job_id, "--json", "--wide"],
                                        capture_output=True, text=True, env=env).stdout or "[]")
    stages = json.loads(subprocess.run([*TRAINWARDEN, "history", "--stages", "--job", job_id, "--json"],
                                       capture_output=True, text=True, env=env).stdout or "[]")
    restarts = sum(1 for r in records if r["action"] == "restart_job")
    decision = stages[0]["decided_at"] if stages else (
        min((r["time"] for r in records), default=None) if records else None)
    failed = [r for r in records if r["action"] == "fail_job"]
    if decision is None and failed:
        decision = failed[0]["time"]
    return dict(facts, restarts=restarts, decision_t=decision, code=proc.returncode, wall=wall,
                acted=bool(records))


def run_torchrun(fault: str, tmp: Path, cap: float, extra: tuple = ()) -> dict:
    checkpoints = tmp / f"torchrun-{fault}-ckpt"
    checkpoints.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
               "--max-restarts", "3", str(PROGRAM), "--result", str(tmp / f"torchrun-{fault}.json"),
               "--fault", fault, "--checkpoint-dir", str(checkpoints), *extra]
    started = time.time()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=cap)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        code = None
        subprocess.run(["pkill", "-f", str(PROGRAM)], check=False)
    wall = time.time() - started
    facts = parse(output)
    facts["ready_t"] = ready_again(output)
    restarts = max(facts["rounds"]) if facts["rounds"] else 0
    return dict(facts, restarts=restarts, code=code, wall=wall, acted=facts["decision_t"] is not None)


def row(label: str, launcher: str, result: dict, recoverable: bool, cap: float) -> str:
    fault_t = result["fault_t"]
    decided = result["decision_t"]
    detected = "yes" if result["acted"] else f"no (not within {cap:.0f} s)"
    to_decision = f"{decided - fault_t:.1f}" if decided and fault_t else "-"
    to_again = f"{result['again_t'] - fault_t:.1f}" if result["again_t"] and fault_t else "-"
    useless = max(0, result["restarts"] - (1 if recoverable else 0))
    outcome = {0: "succeeded", 1: "failed", None: "killed at the cap"}.get(result["code"], f"exit {result['code']}")
    return (f"| {label} | {launcher} | {detected} | {to_decision} | {to_again} | {useless} | "
            f"{result['wall']:.1f} | {outcome} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hang-cap", type=float, default=120, help="seconds a torchrun run may take")
    parser.add_argument("--faults", default=",".join(f for f, _, _ in FAULTS))
    args = parser.parse_args()
    import torch

    chosen = [f for f in FAULTS if f[0] in args.faults.split(",")]
    print(f"# Faults in a real torch DDP job (torch {torch.__version__}, gloo on CPU, 3 ranks; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f})\n")
    print("| fault | launcher | detected | s to decision | s to all ranks training again | useless restarts "
          "| wall s | job |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for fault, label, recoverable in chosen:
        with tempfile.TemporaryDirectory(prefix="tw-bench-torch-") as raw:
            tmp = Path(raw)
            print(row(label, "Trainwarden", run_trainwarden(fault, tmp, args.hang_cap), recoverable,
                      args.hang_cap), flush=True)
            print(row(label, "torchrun", run_torchrun(fault, tmp, args.hang_cap), recoverable, args.hang_cap),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
