"""A small real torch.distributed (gloo, CPU) DDP job that checkpoints and
resumes, with one fault injected on request.

Deterministic: the data of each step depends only on the step and the rank,
so a run that resumes from its checkpoint ends with the same weights as a
fault-free run. Rank 0 writes the result to --result.

    python ddp_train.py --result out.json [--fault F --fault-rank R --fault-step S] [--report-progress]

--report-progress: rank 0 tells Trainwarden the step of every checkpoint it
saves (the SDK's report_progress).

Faults (in the first round only unless said otherwise):
    user_exception      a ValueError in the training code
    shape_error         a shape mismatch in every round, with 2 s of exit handlers
    sigkill             the rank kills itself with SIGKILL
    hang                the rank stops before its all_reduce; the others block inside gloo
    early_exit          the rank exits 0 early; the others lose it
    kill_in_collective  the rank is SIGKILLed in the middle of a large all_reduce
    slow_start          every rank takes --slow-start-s before its first line
    wrong_world         every round: the process group is asked for one rank more than
                        the job has (a configuration error); gloo's store times out in 3 s
    sigkill_each_round  rounds 0 to 2: the rank SIGKILLs itself 6 steps further each
                        round (past the checkpoint the round resumed from)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ENV = os.environ
RANK = int(ENV.get("RANK", "0"))
WORLD = int(ENV.get("WORLD_SIZE", "1"))
# Trainwarden's round, or torchrun's restart count when torchrun restarts us.
ROUND = int(ENV.get("TRAINWARDEN_RESTART_ROUND") or ENV.get("TORCHELASTIC_RESTART_COUNT") or "0")


def log(text: str) -> None:
    print(f"{text} rank={RANK} round={ROUND} t={time.time():.3f}", flush=True)


def process_group(fault: str) -> None:
    if fault == "wrong_world":
        dist.init_process_group("gloo", init_method="env://", world_size=WORLD + 1, rank=RANK,
                                timeout=timedelta(seconds=3))
    elif "TORCHELASTIC_RUN_ID" in ENV and "TRAINWARDEN_JOB_ID" not in ENV:
        # Stock torchrun restarts keep MASTER_PORT; gloo's connectFullMesh then
        # meets the previous attempt's addresses in the store. A prefix per
        # attempt is the known workaround.
        store = dist.TCPStore(ENV["MASTER_ADDR"], int(ENV["MASTER_PORT"]), WORLD, is_master=False,
                              use_libuv=False)
        store = dist.PrefixStore(f"attempt-{ROUND}", store)
        dist.init_process_group("gloo", store=store, rank=RANK, world_size=WORLD)
    else:
        dist.init_process_group("gloo", init_method="env://")


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + RANK)
    x = torch.randn(16, 8, generator=generator)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    return x, y


def load_next_shard(seconds: float) -> None:
    # The stuck rank: the stack report should find it here.
    time.sleep(seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=12)
    parser.add_argument("--slow-start-s", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", default=ENV.get("TRAINWARDEN_CHECKPOINT_DIR", ""))
    parser.add_argument("--result", required=True)
    parser.add_argument("--report-progress", action="store_true")
    args = parser.parse_args()

    fault = args.fault
    here = RANK == args.fault_rank and (ROUND == 0 or fault == "shape_error"
                                        or (fault == "sigkill_each_round" and ROUND < 3))
    fault_step = args.fault_step + (6 * ROUND if fault == "sigkill_each_round" else 0)
    monitor = None
    if args.report_progress and RANK == 0:
        from trainwarden.sdk import job_monitor

        monitor = job_monitor.Monitor()
    if fault == "slow_start" and ROUND == 0:
        time.sleep(args.slow_start_s)
    log("starting")
    process_group(fault)
    log("process group ready")

    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    checkpoint = os.path.join(args.checkpoint_dir, "ckpt.pt") if args.checkpoint_dir else ""
    start = 0
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        log(f"resumed from step {start}")

    for step in range(start, args.steps):
        if here and step == fault_step:
            inject(fault, step)
        if fault == "kill_in_collective" and ROUND == 0 and step == args.fault_step:
            # Every rank enters a large all_reduce (about 80 MB); the fault rank dies inside it.
            large = torch.ones(20_000_000)
            dist.all_reduce(large)
        x, y = batch(step)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP's all_reduce of the gradients
        optimizer.step()
        log(f"step {step} loss {loss.item():.6f}")
        if checkpoint and RANK == 0 and step % args.ckpt_every == 0:
            tmp = checkpoint + ".tmp"
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, checkpoint)
            if monitor is not None:
                status = monitor.report_progress(step)
                if not status.ok():
                    log(f"report_progress failed: {status.to_string()}")
        dist.barrier()  # the checkpoint is on disk before anyone goes further
        time.sleep(args.step_s)

    if RANK == 0:
        weights = model.module.weight.detach().flatten().tolist() + model.module.bias.detach().tolist()
        with open(args.result, "w") as handle:
            json.dump({"weights": weights, "resumed_from": start, "round": ROUND}, handle)
    log("done")
    dist.destroy_process_group()
    return 0


def inject(fault: str, step: int) -> None:
    log(f"injecting {fault} at step {step}")
    if fault == "user_exception":
        raise ValueError(f"label 7 is outside the 5 classes of this dataset (step {step})")
    if fault == "shape_error":
        atexit.register(time.sleep, 2.0)  # a metrics logger flushing on exit
        nn.Linear(16, 4)(torch.randn(8, 8))
    if fault in ("sigkill", "sigkill_each_round"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        load_next_shard(3600)
    if fault == "early_exit":
        log("finishing early")
        os._exit(0)
    if fault == "kill_in_collective":
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()


if __name__ == "__main__":
    sys.exit(main())
