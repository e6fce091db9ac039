"""A worker that checkpoints on SIGTERM from inside a @hang_detect scope:
leaving the scope is an SDK call, made while Trainwarden is stopping it.
Rank 1 is killed in round 0 (a retryable fault); round 1 finishes."""

import os
import signal
import sys
import time

from trainwarden.sdk import job_monitor as jm

RANK = int(os.environ["RANK"])
ROUND = int(os.environ["TRAINWARDEN_RESTART_ROUND"])


def on_term(signum, frame):
    print(f"checkpoint saved at {time.time():.3f}", flush=True)
    raise SystemExit(0)  # unwinds through hang_detect, which restores the interval


signal.signal(signal.SIGTERM, on_term)


@jm.hang_detect(600)
def train():
    for step in range(10_000):
        print(f"step {step}", flush=True)
        if RANK == 1 and ROUND == 0 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        if ROUND == 1 and step == 3:
            return
        time.sleep(0.1)


train()
print(f"rank {RANK} done", flush=True)
sys.exit(0)
