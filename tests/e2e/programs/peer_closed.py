"""A stand-in for a 3-rank gloo job in which rank 1 hits a persistent shape
error: rank 1 serves the ranks' connections, raises, closes them, and then
spends 2 s in exit handlers (a metrics logger syncing); ranks 0 and 2 see
the closed connection and exit at once with gloo's message.

    peer_closed.py            one rank (RANK, MASTER_ADDR, MASTER_PORT from the environment)
    peer_closed.py --launcher a torchrun-like launcher: runs the three ranks, prefixes their
                              output with [rankN]:, stops the others with SIGTERM after the
                              first failure and prints torchrun's ChildFailedError summary
"""

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time

WORLD = 3
FAILING_RANK = 1


def serve(port: int) -> None:
    server = socket.create_server(("127.0.0.1", port))
    peers = [server.accept()[0] for _ in range(WORLD - 1)]
    print("rank 1: 2 peers connected; step 0", flush=True)
    atexit.register(time.sleep, 2.0)  # slow exit handlers
    try:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x16 and 32x4)")
    finally:
        for peer in peers:
            peer.close()
        server.close()


def connect(port: int, rank: int) -> None:
    deadline = time.time() + 30
    while True:
        try:
            peer = socket.create_connection(("127.0.0.1", port), timeout=30)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    print(f"rank {rank}: connected; step 0", flush=True)
    local = peer.getsockname()[1]
    if peer.recv(1) == b"":
        sys.stderr.write(f"Traceback (most recent call last):\n  File \"/job/train.py\", line 88, in <module>\n"
                         f"    dist.all_reduce(loss)\n  File \"/usr/lib/python3/dist-packages/torch/distributed/"
                         f"distributed_c10d.py\", line 2501, in all_reduce\n    work.wait()\n"
                         f"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
                         f"peer [127.0.0.1]:{local}\n")
        sys.stderr.flush()
        os._exit(1)


def rank_main() -> None:
    rank = int(os.environ["RANK"])
    port = int(os.environ["MASTER_PORT"])
    if rank == FAILING_RANK:
        serve(port)
    else:
        connect(port, rank)


def launcher_main() -> None:
    """What torchrun does with --tee 3: every rank's output, prefixed, in one stream."""
    port = int(os.environ["MASTER_PORT"])
    children = {}
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_PORT=str(port))
        children[rank] = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)

    def pump(rank, child):
        for line in child.stdout:
            sys.stdout.write(f"[rank{rank}]:{line}")
            sys.stdout.flush()

    pumps = [threading.Thread(target=pump, args=item) for item in children.items()]
    for thread in pumps:
        thread.start()
    first = None
    while first is None:
        for rank, child in children.items():
            if child.poll() is not None and child.returncode != 0:
                first = rank
                break
        time.sleep(0.02)
    for rank, child in children.items():
        if child.poll() is None:
            print(f"W1201 10:00:00.000000 {os.getpid()} torch/distributed/elastic/multiprocessing/api.py:897] "
                  f"Sending process {child.pid} closing signal SIGTERM", flush=True)
            child.send_signal(signal.SIGTERM)
    for child in children.values():
        child.wait()
    for thread in pumps:
        thread.join()
    others = [r for r in children if r != first and children[r].returncode != 0]
    lines = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================", "train.py FAILED",
             "------------------------------------------------------------", "Failures:"]
    for index, rank in enumerate(others, 1):
        lines += [f"[{index}]:", f"  rank      : {rank} (local_rank: {rank})",
                  f"  exitcode  : {children[rank].returncode} (pid: {children[rank].pid})"]
    lines += ["------------------------------------------------------------", "Root Cause (first observed failure):",
              "[0]:", f"  rank      : {first} (local_rank: {first})",
              f"  exitcode  : {children[first].returncode} (pid: {children[first].pid})",
              "============================================================"]
    print("\n".join(lines), flush=True)
    sys.exit(1)


if __name__ == "__main__":
    launcher_main() if "--launcher" in sys.argv else rank_main()
