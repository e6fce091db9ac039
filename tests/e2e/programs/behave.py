"""A stand-in training process whose faults are chosen on the command line.

Every option that names ranks/incarnations takes a comma list or "all";
incarnations are matched on TRAINWARDEN_RESTART_ROUND (--*-rounds) and
TRAINWARDEN_INSTANCE_RESTARTS (--*-starts).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from trainwarden.sdk import job_monitor as jm

ENV = os.environ
RANK = int(ENV.get("RANK", "0"))
ROUND = int(ENV.get("TRAINWARDEN_RESTART_ROUND", "0"))
START = int(ENV.get("TRAINWARDEN_INSTANCE_RESTARTS", "0"))
ROLE = ENV.get("TRAINWARDEN_ROLE", "worker")
NAME = ENV.get("TRAINWARDEN_INSTANCE", "?")


def chosen(spec, value):
    return spec == "all" or str(value) in spec.split(",")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--fail-rank", default="")
    p.add_argument("--fail-role", default="")
    p.add_argument("--fail-rounds", default="all")
    p.add_argument("--fail-starts", default="all")
    p.add_argument("--fail-at-step", type=int, default=1)
    p.add_argument("--fail-code", type=int, default=1)
    p.add_argument("--fail-message", default="")
    p.add_argument("--hang-rank", default="")
    p.add_argument("--hang-rounds", default="all")
    p.add_argument("--hang-at-step", type=int, default=1)
    p.add_argument("--keyword", action="append", default=[])
    p.add_argument("--scope-interval", type=int, default=None)
    p.add_argument("--scope-silent-s", type=float, default=0)
    p.add_argument("--scope-rounds", default="all")
    p.add_argument("--finish-rank", default="", help="these ranks finish after one step")
    p.add_argument("--linger-rank", default="", help="these ranks stay silent and never finish")
    p.add_argument("--linger-rounds", default="all")
    p.add_argument("--message", default="")
    p.add_argument("--message-rounds", default="all")
    p.add_argument("--message-rank", default="all")
    p.add_argument("--say", default="", help="print this line at start (as the job's own output)")
    p.add_argument("--reset-interval", type=int, default=None, help="reset_config(job_hang_interval=N), then")
    p.add_argument("--silent-s", type=float, default=0, help="...stay silent this long (round 0 only)")
    p.add_argument("--crash-keyword", default="", help="set this retryable keyword just before failing")
    p.add_argument("--child", action="store_true", help="start a data-loader child that sleeps")
    p.add_argument("--serve-role", default="", help="instances of these roles print until stopped (ps)")
    p.add_argument("--env", action="store_true", help="print the Trainwarden and torchrun variables")
    a = p.parse_args()

    monitor = jm.Monitor(config=jm.PyTorchConfig())
    print(f"hello {NAME} rank={RANK} round={ROUND} start={START} pid={os.getpid()}", flush=True)
    if a.keyword:
        st = monitor.set_retryable_errors(a.keyword)
        print(f"keywords {st.to_string()}", flush=True)
    if a.say:
        print(a.say, flush=True)
    if a.message and chosen(a.message_rounds, ROUND) and chosen(a.message_rank, RANK):
        st = monitor.send_custom_message(content=a.message)
        print(f"message {st.to_string()}", flush=True)
    if a.child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if a.env:
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TRAINWARDEN_JOB_ID",
                "TRAINWARDEN_INSTANCE", "TRAINWARDEN_RESTART_ROUND", "TRAINWARDEN_INSTANCE_RESTARTS",
                "TORCHELASTIC_RESTART_COUNT", "TRAINWARDEN_CALLER", "TRAINWARDEN_NODE")
        print("env " + json.dumps({k: ENV.get(k) for k in keys}), flush=True)
    if a.reset_interval is not None and ROUND == 0:
        st = monitor.reset_config(job_hang_interval=a.reset_interval)
        print(f"reset {a.reset_interval} {st.to_string()} at {time.time():.3f}", flush=True)
        time.sleep(a.silent_s)
    if a.linger_rank and chosen(a.linger_rank, RANK) and chosen(a.linger_rounds, ROUND):
        time.sleep(600)
    if a.scope_interval is not None and chosen(a.scope_rounds, ROUND):
        @jm.hang_detect(a.scope_interval)
        def evaluate():
            print(f"scope {a.scope_interval} entered at {time.time():.3f}", flush=True)
            time.sleep(a.scope_silent_s)

        evaluate()
        print("scope left", flush=True)
    steps = 1 if a.finish_rank and chosen(a.finish_rank, RANK) else a.steps
    serving = bool(a.serve_role) and chosen(a.serve_role, ROLE)
    step = -1
    while serving or step + 1 < steps:
        step += 1
        print(f"step {step} pid={os.getpid()}", flush=True)
        fail_here = (a.fail_rank and chosen(a.fail_rank, RANK)) or (a.fail_role and chosen(a.fail_role, ROLE))
        if fail_here and step == a.fail_at_step and chosen(a.fail_rounds, ROUND) and chosen(a.fail_starts, START):
            if a.fail_message:
                print(a.fail_message, file=sys.stderr, flush=True)
            if a.crash_keyword:
                # Taken into account when this very crash is judged: the call returns only then.
                monitor.set_retryable_errors([a.crash_keyword])
            sys.exit(a.fail_code)
        if a.hang_rank and chosen(a.hang_rank, RANK) and step == a.hang_at_step and chosen(a.hang_rounds, ROUND):
            print(f"hanging at {time.time():.3f}", flush=True)
            time.sleep(600)
        time.sleep(a.step_s)
    print(f"done {NAME}", flush=True)


if __name__ == "__main__":
    main()
