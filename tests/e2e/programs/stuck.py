"""Ranks that hang in round 0: most in a collective, one elsewhere, each with
a data-loader thread; round 1 finishes. For stack snapshot tests."""

import os
import threading
import time

RANK = int(os.environ["RANK"])
ROUND = int(os.environ["TRAINWARDEN_RESTART_ROUND"])
ODD = int(os.environ.get("ODD_RANK", "3"))


def prefetch_batches():
    while True:
        time.sleep(1000)


def wait_for_allreduce():
    time.sleep(1000)


def load_corrupt_shard():
    time.sleep(1000)


def train_step():
    if RANK == ODD:
        load_corrupt_shard()
    else:
        wait_for_allreduce()


threading.Thread(target=prefetch_batches, name="data-loader", daemon=True).start()
print(f"rank {RANK} round {ROUND} pid {os.getpid()}", flush=True)
if ROUND == 0:
    train_step()
print("done", flush=True)
