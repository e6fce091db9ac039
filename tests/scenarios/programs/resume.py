"""A training stand-in that checkpoints: each step is saved under
$TRAINWARDEN_CHECKPOINT_DIR; a resumed incarnation (TRAINWARDEN_RESUME=1)
starts after the last saved step; SIGTERM saves and says so before exiting
(the lines a worker prints while it is being stopped)."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from trainwarden.sdk import job_monitor as jm

RANK = int(os.environ.get("RANK", "0"))
ROUND = int(os.environ.get("TRAINWARDEN_RESTART_ROUND", "0"))
START = int(os.environ.get("TRAINWARDEN_INSTANCE_RESTARTS", "0"))
NAME = os.environ.get("TRAINWARDEN_INSTANCE", "?")


def forge() -> str:
    """What a process that left the instance's tree gets back: a double-forked
    daemon (reparented away from the instance) calls the SDK."""
    import socket

    from trainwarden.sdk.protocol import encode_request

    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        middle_pid = os.getpid()
        if os.fork() != 0:
            os._exit(0)  # the daemon's parent leaves: the daemon is reparented
        os.setsid()
        while os.getppid() == middle_pid:
            time.sleep(0.01)
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(20)
                conn.connect(os.environ["TRAINWARDEN_SDK_SOCKET"])
                conn.sendall(encode_request("custom_message", content="loss is nan"))
                reply = conn.makefile("rb").readline()
        except OSError as exc:
            reply = f"error {exc}".encode()
        os.write(write_end, reply)
        os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)
    with os.fdopen(read_end, "rb") as answer:
        return answer.read().decode().strip()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-round", type=int, default=0)
    p.add_argument("--fail-at-step", type=int, default=2)
    p.add_argument("--fail-start", type=int, default=None,
                   help="fail only in this incarnation of the instance (a restart alone keeps the round)")
    p.add_argument("--fail-message", default="")
    p.add_argument("--fail-rounds", type=int, default=1,
                   help="fail in rounds --fail-round to --fail-round + N - 1")
    p.add_argument("--report-progress", action="store_true",
                   help="rank 0 reports every step it saved through the SDK; the failing rank fails only "
                        "once rank 0 has reported in its round")
    p.add_argument("--hang-round", type=int, default=-1)
    p.add_argument("--hang-at-step", type=int, default=2)
    p.add_argument("--keyword", default="")
    p.add_argument("--message", default="")
    p.add_argument("--say", default="", help="rank 0 prints this at step 1, as its own output")
    p.add_argument("--forge", action="store_true", help="a daemon rank 0 leaves behind calls the SDK")
    a = p.parse_args()

    directory = Path(os.environ["TRAINWARDEN_CHECKPOINT_DIR"]) / NAME
    directory.mkdir(parents=True, exist_ok=True)
    saved = directory / "step.json"
    step = 0
    resume = os.environ.get("TRAINWARDEN_RESUME") == "1"
    if resume and saved.exists():
        step = json.loads(saved.read_text())["step"] + 1
    print(f"{'resuming' if resume else 'starting'} {NAME} round={ROUND} at step {step} "
          f"resume={os.environ.get('TRAINWARDEN_RESUME')} rank={RANK} world={os.environ.get('WORLD_SIZE')} "
          f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
          f"node={os.environ.get('TRAINWARDEN_NODE')}", flush=True)

    last = [step - 1]

    def save(at: int) -> None:
        tmp = saved.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": at}))
        tmp.replace(saved)
        last[0] = at

    def on_sigterm(signum, frame):
        print(f"sigterm: {NAME} stops; its checkpoint holds step {last[0]}", flush=True)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    monitor = jm.Monitor(config=jm.PyTorchConfig())
    if a.keyword:
        print(f"keywords {monitor.set_retryable_errors([a.keyword]).to_string()}", flush=True)
    while step < a.steps:
        print(f"step {step}", flush=True)
        if (RANK == a.fail_rank and a.fail_round <= ROUND < a.fail_round + a.fail_rounds
                and step >= a.fail_at_step and a.fail_start in (None, START)):
            marker = directory.parent / f"reported-round-{ROUND}"
            waited = time.monotonic()
            while a.report_progress and not marker.exists() and time.monotonic() - waited < 20:
                time.sleep(0.05)
            print(a.fail_message, file=sys.stderr, flush=True)
            sys.exit(1)
        if ROUND == a.hang_round and step == a.hang_at_step:
            print("hanging", flush=True)
            time.sleep(600)
        if a.say and RANK == 0 and step == 1:
            print(a.say, flush=True)
        if a.forge and RANK == 0 and step == 1:
            print(f"forged: {forge()}", flush=True)
        if a.message and RANK == 0 and ROUND == 0 and step == a.fail_at_step:
            print(f"message {monitor.send_custom_message(content=a.message).to_string()}", flush=True)
        save(step)
        if a.report_progress and RANK == 0:  # the checkpoint just saved is how far the job got
            status = monitor.report_progress(step)
            if not status.ok():
                print(f"report_progress: {status.to_string()}", flush=True)
            (directory.parent / f"reported-round-{ROUND}").touch()
        step += 1
        time.sleep(a.step_s)
    print(f"done {NAME}", flush=True)


if __name__ == "__main__":
    main()
