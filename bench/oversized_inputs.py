"""What refusing an oversized input costs: each input is made in a temporary
directory and handed to the command that reads it, in a process of its own;
prints the wall time, that process's peak memory (max RSS), the exit code and
how long its error output is.

Inputs (issue 29, break 4): a job file with 100,000 roles; a 1 MB arguments
string in a job file, and the longest one a command line can carry (128 KiB)
given to --args; a 50 MB rules file of invalid entries; a job file and a
rules file just under their byte limits, full of values; a 50 MB subscription
file; and what the bus carries to the processor: a JobSubmitted of 100,000
instances (7 MB), and one of a 1 MB arguments string, decoded and started by
the engine as the processor does.

    .venv/bin/python bench/oversized_inputs.py [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "trainwarden.cli.main"]

# The bus path: what a processor does with a JobSubmitted it reads (bus/serde.decode, engine.start_job).
_SUBMITTED = """
import sys
from trainwarden.bus import EVENTS
from trainwarden.bus.serde import decode, encode
from trainwarden.engine import start_job
from trainwarden.events import InstanceSpec, JobSubmitted
from trainwarden.rules.loader import load_rules
pack = load_rules()
count, args = (100_000, "") if sys.argv[1] == "instances" else (2, "--job-hang-interval=" + "x" * 1_000_000)
instances = tuple(InstanceSpec(name=f"worker-{i}", role="worker", index=i, rank=i) for i in range(count))
value = encode(JobSubmitted(job_id="huge", time=0.0, framework="pytorch", args=args, instances=instances))
print(f"a message of {len(value):,} bytes:", end=" ", file=sys.stderr)
state, decisions = start_job(decode(EVENTS, value), pack, 1.0)
print(decisions[0].kind.value, f"({len(decisions[0].error_message)} characters of message)",
      decisions[0].error_message[:120], file=sys.stderr)
"""


def make_inputs(tmp: Path) -> dict[str, list[str]]:
    """name -> the command that reads the input."""
    roles = tmp / "roles.yaml"
    with roles.open("w") as out:
        out.write("roles:\n")
        for index in range(100_000):
            out.write(f"  worker-{index}: {{count: 1, command: [python, train.py]}}\n")
    args_file = tmp / "args.yaml"
    args_file.write_text("args: --job-hang-interval=" + "x" * 1_000_000 + "\nroles:\n  worker: {command: [true]}\n")
    rules = tmp / "rules" / "90-huge.yaml"
    rules.parent.mkdir()
    entry = ("  - name: Bad_Name_{i}\n    category: user_code_error\n    retryable: maybe\n"
             "    patterns: ['Traceback \\\\(most recent call last\\\\)', 'Error: something went wrong here']\n"
             "    description: an entry of a generated file whose every entry is wrong, about this long\n")
    with rules.open("w") as out:
        out.write("version: 1\nclassifiers:\n")
        while out.tell() < 50_000_000:
            out.write(entry.format(i=out.tell()))
    # Just under the byte limits: what the value limits and the error cap bound.
    dense_job = tmp / "dense-job.yaml"
    with dense_job.open("w") as out:
        out.write("roles:\n")
        while out.tell() < 250 * 1024:
            out.write(f"  worker-{out.tell()}: {{count: 1, command: [python, train.py]}}\n")
    dense_rules = tmp / "dense-rules" / "90-dense.yaml"
    dense_rules.parent.mkdir()
    with dense_rules.open("w") as out:
        out.write("version: 1\nclassifiers:\n")
        while out.tell() < 4 * 1024 * 1024 - 1024:
            out.write(entry.format(i=out.tell()))
    subs = tmp / "subs" / "huge.yaml"
    subs.parent.mkdir()
    with subs.open("w") as out:
        out.write("version: 1\nsubscriptions:\n")
        while out.tell() < 50_000_000:
            out.write(f"  - name: s{out.tell()}\n    target: {{url: 'https://hooks.example.com/x'}}\n")
    return {
        "job file, 100,000 roles": [*CLI, "run", str(roles)],
        "job file, 1 MB args": [*CLI, "run", str(args_file)],
        "--args, 128 KiB": [*CLI, "run", "--args", "--job-hang-interval=" + "1" * (128 * 1024 - 30), "--", "true"],
        "job file, 250 KiB of roles": [*CLI, "run", str(dense_job)],
        "rules file, 50 MB": [*CLI, "rules", "validate", str(rules)],
        "rules file, 4 MiB of mistakes": [*CLI, "rules", "validate", str(dense_rules)],
        "subscription file, 50 MB": [*CLI, "notify", "validate", str(subs.parent)],
        "JobSubmitted, 100,000 instances": [sys.executable, "-c", _SUBMITTED, "instances"],
        "JobSubmitted, 1 MB args": [sys.executable, "-c", _SUBMITTED, "args"],
    }


def measure(command: list[str]) -> tuple[float, float, int, str]:
    """Seconds, peak RSS in MB, exit code and error output of one process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"), TRAINWARDEN_STORE=tempfile.mkdtemp())
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - started, usage.ru_maxrss / 1024, proc.returncode, err


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="run only the inputs whose name contains this")
    only = parser.parse_args().only
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_inputs(Path(tmp))
        print(f"{'input':32} {'time':>8} {'peak RSS':>10} {'exit':>5} {'error bytes':>12} {'lines':>7}  first line")
        for name, command in cases.items():
            if only and only not in name:
                continue
            seconds, peak_mb, code, err = measure(command)
            first = err.strip().splitlines()[0][:100] if err.strip() else ""
            print(f"{name:32} {seconds:7.2f}s {peak_mb:8.0f}MB {code:5} {len(err):12} {err.count(chr(10)):7}  "
                  f"{first}", flush=True)


if __name__ == "__main__":
    main()
