"""Back to training after a crash: the same real PyTorch DDP job
(tests/torch/programs/ddp_train.py: gloo on CPU, 3 ranks, a checkpoint
every 5 steps) with rank 1 SIGKILLed about 35 s into training, under Trainwarden without and with
``--preload`` (standby interpreters that imported torch before the restart)
and under torchrun.

For each launcher, over ``--repeat`` runs (median): seconds from the fault
to the decision, to every rank's process group being ready again, and to
every rank's first training step after the restart.

    .venv/bin/python bench/restart_preload.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_faults  # noqa: E402 - the same job, launchers and parsing as bench/torch_faults.py

PRELOAD = "torch"


# The fault comes about 35 s into training, in the job's steady state: the
# next round's spares are prepared once the instances have started (about
# 10 s in here), and beside three CPU-bound ranks on 2 cores their imports
# take 15-20 s.
STEADY = ("--steps", "660", "--fault-step", "600")


def run(launcher: str, tmp: Path) -> dict:
    if launcher == "torchrun":
        return torch_faults.run_torchrun("sigkill", tmp, cap=180, extra=STEADY)
    return torch_faults.run_trainwarden("sigkill", tmp, cap=180, extra=STEADY,
                                        preload=PRELOAD if launcher == "preload" else "")


def measure(launcher: str, repeat: int) -> dict:
    samples = {"decision": [], "ready": [], "training": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="tw-bench-preload-") as raw:
            result = run(launcher, Path(raw))
        fault = result["fault_t"]
        if fault is None or result["again_t"] is None:
            continue
        if result["decision_t"]:
            samples["decision"].append(result["decision_t"] - fault)
        if result.get("ready_t"):
            samples["ready"].append(result["ready_t"] - fault)
        samples["training"].append(result["again_t"] - fault)
    return {k: statistics.median(v) if v else None for k, v in samples.items()} | {
        "runs": len(samples["training"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per launcher (the median is printed)")
    parser.add_argument("--only", choices=["plain", "preload", "torchrun"], action="append",
                        help="just this launcher (repeatable)")
    args = parser.parse_args()
    import torch

    print(f"# Fault to training again: SIGKILL of rank 1 in a real torch DDP job (torch {torch.__version__}, "
          f"gloo on CPU, 3 ranks; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; median of "
          f"{args.repeat})\n")
    print("| launcher | runs | s to decision | s to process groups ready | s to all ranks training again |")
    print("| --- | ---: | ---: | ---: | ---: |")
    labels = {"plain": "Trainwarden", "preload": f"Trainwarden --preload {PRELOAD}", "torchrun": "torchrun"}
    for launcher, label in labels.items():
        if args.only and launcher not in args.only:
            continue
        figures = measure(launcher, args.repeat)

        def cell(key: str) -> str:
            return f"{figures[key]:.2f}" if figures[key] is not None else "-"

        print(f"| {label} | {figures['runs']} | {cell('decision')} | {cell('ready')} | {cell('training')} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
