"""A crash loop: a real PyTorch job whose configuration is wrong fails the
same way at start-up in every round, and its lines look transient.

tests/torch/programs/ddp_train.py with ``--fault wrong_world``: 3 ranks ask
gloo for a process group of 4; the store times out after 3 s in every round
(``DistStoreError: ... wait timeout`` / ``Timed out ... waiting for
clients``), which the catalogue judges a retryable rendezvous timeout. Each
launcher has a budget of 20 restarts, as a long pre-training run would:

- Trainwarden with the no-progress guards (the default,
  ``--max-num-of-no-progress-restart=3``, and the same failure again
  without progress fails after one restart: engine/operational.py);
- Trainwarden with the guard off (``=-1``): the restart budget alone;
- torchrun ``--max-restarts 20`` (stock, ``--standalone``).

For each: restarts made, seconds until the job is declared failed, and why.

    .venv/bin/python bench/crash_loop.py [--repeat 3]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "torch" / "programs" / "ddp_train.py"
TRAINWARDEN = [sys.executable, "-m", "trainwarden.cli.main"]
BUDGET = 20
CAP_S = 900


def run_trainwarden(tmp: Path, guard: str) -> dict:
    job_id = f"bench-crash-loop-{time.monotonic_ns()}"
    env = dict(os.environ, TRAINWARDEN_STORE=str(tmp / "store"), PYTHONPATH=str(ROOT / "pipeline"))
    args = f"--enable-job-restart=True --max-num-of-job-restart={BUDGET} --max-num-of-no-progress-restart={guard}"
    started = time.time()
    proc = subprocess.run([*TRAINWARDEN, "run", "--job-id", job_id, "--nproc", "3", "--args", args, "--",
                           sys.executable, str(PROGRAM), "--result", str(tmp / "result.json"),
                           "--fault", "wrong_world"], capture_output=True, text=True, env=env, timeout=CAP_S)
    wall = time.time() - started
    records = json.loads(subprocess.run([*TRAINWARDEN, "history", "--job", job_id, "--json", "--wide"],
                                        capture_output=True, text=True, env=env).stdout or "[]")
    restarts = sum(1 for r in records if r["action"] == "restart_job")
    why = next((r["reason"] for r in records if r["action"] == "fail_job"), f"exit {proc.returncode}")
    return {"restarts": restarts, "wall": wall, "why": why, "code": proc.returncode}


def run_torchrun(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                           "--max-restarts", str(BUDGET), str(PROGRAM), "--result", str(tmp / "result.json"),
                           "--fault", "wrong_world"], capture_output=True, text=True, env=env, timeout=CAP_S)
    wall = time.time() - started
    output = proc.stdout + proc.stderr
    # Every attempt's rank 0 says "starting ... round=N" before its process group.
    rounds = {line.split("round=")[1].split()[0] for line in output.splitlines()
              if line.startswith("starting rank=0 ")}
    return {"restarts": max(len(rounds) - 1, 0), "wall": wall, "why": f"max restarts ({BUDGET}) used up",
            "code": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per launcher (the median is printed)")
    args = parser.parse_args()
    import torch

    launchers = (
        ("Trainwarden (no-progress guard, default 3)", lambda tmp: run_trainwarden(tmp, "3")),
        ("Trainwarden, guard off (-1)", lambda tmp: run_trainwarden(tmp, "-1")),
        (f"torchrun --max-restarts {BUDGET}", run_torchrun),
    )
    print(f"# A crash loop: a real torch DDP job asking gloo for 4 ranks with 3 (torch {torch.__version__}, "
          f"gloo on CPU; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; budget {BUDGET} restarts; "
          f"median of {args.repeat})\n")
    print("| launcher | restarts | s until the job is declared failed | why |")
    print("| --- | ---: | ---: | --- |")
    for label, launch in launchers:
        results = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="tw-bench-crash-loop-") as raw:
                results.append(launch(Path(raw)))
        restarts = statistics.median(r["restarts"] for r in results)
        wall = statistics.median(r["wall"] for r in results)
        whys = sorted({r["why"] for r in results})
        print(f"| {label} | {restarts:g} | {wall:.1f} | {', '.join(whys)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
