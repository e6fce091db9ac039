"""A small data-parallel training job with fault injection, for `trainwarden run`.

With PyTorch installed it trains a tiny regression model with DDP over gloo on
CPU; without it, a plain-Python stand-in does the same arithmetic on each
rank's shard, without exchanging gradients (so the example runs anywhere).

It uses the SDK the way real jobs do: retryable keywords, a custom message
on NaN, and staged hang detection (a long interval for start-up, a short one
per step, none during evaluation). It checkpoints every CHECKPOINT_EVERY steps
(default 5) and resumes from the latest checkpoint after a restart or, for a
spot job, after a preemption (TRAINWARDEN_RESUME=1, TRAINWARDEN_CHECKPOINT_DIR).

Fault injection, from the FAULTS environment variable, e.g.
    FAULTS="crash:rank=1:step=6:round=0,hang:step=14:round=1,nan:step=3:round=0"
    crash  exits with a retryable NCCL-style error (or code=N message=TEXT)
    hang   stops printing and sleeps (every rank), like a stuck collective
    nan    reports a NaN loss through the SDK's custom message
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from trainwarden.sdk import job_monitor as jm

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
ROUND = int(os.environ.get("TRAINWARDEN_RESTART_ROUND", "0"))
JOB = os.environ.get("TRAINWARDEN_JOB_ID", "manual")
STEPS = int(os.environ.get("STEPS", "20"))
STEP_S = float(os.environ.get("STEP_S", "0.2"))
CKPT = Path(os.environ.get("TRAINWARDEN_CHECKPOINT_DIR") or os.environ.get("CHECKPOINT_DIR")
            or f"/tmp/trainwarden-example/{JOB}")
RESUMING = os.environ.get("TRAINWARDEN_RESUME") == "1"
CHECKPOINT_EVERY = max(1, int(os.environ.get("CHECKPOINT_EVERY", "5")))

monitor = jm.Monitor(config=jm.PyTorchConfig())
# SIGTERM is a stop with notice (a restart, or a spot release announced in
# advance): finish the step, checkpoint, and leave.
TERMINATING = []
signal.signal(signal.SIGTERM, lambda signum, frame: TERMINATING.append(signum))


def faults() -> list[dict]:
    found = []
    for item in filter(None, os.environ.get("FAULTS", "").split(",")):
        kind, *pairs = item.split(":")
        spec = {"kind": kind}
        spec.update(pair.split("=", 1) for pair in pairs)
        found.append(spec)
    return found


def due(spec: dict, step: int) -> bool:
    return (int(spec.get("step", -1)) == step and int(spec.get("round", ROUND)) == ROUND
            and int(spec.get("rank", RANK)) == RANK)


def inject(step: int, loss: float) -> float:
    for spec in faults():
        if not due(spec, step):
            continue
        if spec["kind"] == "crash":
            print(spec.get("message", "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, "
                                      "unhandled system error (run with NCCL_DEBUG=INFO for details)"),
                  file=sys.stderr, flush=True)
            sys.exit(int(spec.get("code", 1)))
        if spec["kind"] == "hang":
            print(f"step {step}: entering all_reduce", flush=True)
            # Stuck until stopped; a SIGTERM aborts it (as NCCL's abort would).
            while not TERMINATING:
                time.sleep(0.05)
            sys.exit(143)
        if spec["kind"] == "nan":
            loss = float("nan")
    return loss


def load_checkpoint() -> tuple[int, list[float]]:
    """The latest checkpoint of an earlier round. In a Sync job every rank must
    resume from the same step, but rank 0 of this round may already have saved
    a newer one before a slower rank gets here: that one is not taken. An
    instance restarted alone (Async: more starts than rounds) may take its own
    round's."""
    starts = int(os.environ.get("TRAINWARDEN_INSTANCE_RESTARTS", "0"))
    usable = []
    for path in CKPT.glob("round-*.json"):
        written_in = int(path.stem.split("-", 1)[1])
        if written_in < ROUND or (written_in == ROUND and starts > ROUND):
            usable.append((written_in, path))
    if usable:
        state = json.loads(max(usable)[1].read_text())
        return state["step"], state["weights"]
    return 0, [0.0, 0.0]


def save_checkpoint(step: int, weights: list[float]) -> None:
    if RANK != 0:
        return
    CKPT.mkdir(parents=True, exist_ok=True)
    tmp = CKPT / f"round-{ROUND}.json.tmp"
    tmp.write_text(json.dumps({"step": step, "weights": weights}))
    tmp.replace(CKPT / f"round-{ROUND}.json")


class Trainer:
    """y = 3x + 1, learnt by gradient descent on this rank's shard."""

    def __init__(self, weights: list[float]):
        self.w, self.b = weights
        self.rng = random.Random(RANK)
        try:
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
            self.torch, self.dist = torch, dist
            self.model = torch.nn.Linear(1, 1)
            with torch.no_grad():
                self.model.weight.fill_(self.w)
                self.model.bias.fill_(self.b)
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
            self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.2)
            self.backend = "torch/gloo"
        except ImportError:
            self.torch = None
            self.backend = "plain python"

    def step(self) -> float:
        xs = [self.rng.uniform(-1, 1) for _ in range(32)]
        ys = [3 * x + 1 for x in xs]
        if self.torch is not None:
            x = self.torch.tensor(xs).unsqueeze(1)
            y = self.torch.tensor(ys).unsqueeze(1)
            self.opt.zero_grad()
            loss = self.torch.nn.functional.mse_loss(self.ddp(x), y)
            loss.backward()
            self.opt.step()
            self.w, self.b = float(self.model.weight), float(self.model.bias)
            return float(loss)
        grads = [0.0, 0.0]
        loss = 0.0
        for x, y in zip(xs, ys):
            err = self.w * x + self.b - y
            loss += err * err / len(xs)
            grads[0] += 2 * err * x / len(xs)
            grads[1] += 2 * err / len(xs)
        self.w -= 0.2 * grads[0]
        self.b -= 0.2 * grads[1]
        return loss


@jm.hang_detect(-1)
def evaluate(trainer: Trainer) -> None:
    # Evaluation may be silent for long: no hang detection inside this scope.
    time.sleep(STEP_S * 2)
    print(f"eval: w={trainer.w:.3f} b={trainer.b:.3f}", flush=True)


def main() -> None:
    monitor.set_retryable_errors(["connect timeout", "store is temporarily unavailable"])
    start, weights = load_checkpoint()
    trainer = Trainer(weights)
    how = "resuming" if RESUMING else "starting"
    print(f"rank {RANK}/{WORLD} round {ROUND}: {trainer.backend}, {how} at step {start}", flush=True)
    train_steps(trainer, start)
    if RANK == 0:
        print(f"trained: w={trainer.w:.3f} (3.0) b={trainer.b:.3f} (1.0)", flush=True)


@jm.hang_detect(int(os.environ.get("STEP_HANG_INTERVAL", "5")))
def train_steps(trainer: Trainer, start: int) -> None:
    for step in range(start, STEPS):
        loss = inject(step, trainer.step())
        if loss != loss:
            st = monitor.send_custom_message(content=f"The training loss of the job is NaN at step {step}.")
            print(f"step {step}: loss is NaN; told the engine: {st.to_string()}", flush=True)
        else:
            print(f"step {step}: loss {loss:.4f}", flush=True)
        if step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 or TERMINATING:
            save_checkpoint(step + 1, [trainer.w, trainer.b])
        if TERMINATING:
            print(f"step {step}: SIGTERM, checkpoint saved at step {step + 1}; leaving", flush=True)
            sys.exit(143)
        if step % 5 == 4:
            evaluate(trainer)
        time.sleep(STEP_S)


if __name__ == "__main__":
    main()
