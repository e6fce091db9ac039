"""The floor under bench/scale.py: the same job restarted with no supervisor at all.

One process starts bench/scale.py's instances itself (the same bash program,
through setpriv as the agents do, stdout and stderr read through pipes), and
when rank 0 crashes it SIGTERMs every other instance's process group, reaps
them, and starts round 1: no bus, no agents, no decision. What this takes
from the crash to the last start is what ending and starting the instances
costs this machine; no supervisor restarts the job faster here.

    python bench/scale_floor.py --sizes 512,1024 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import _machine_busy_s, _times, instance_command  # noqa: E402

SETPRIV = shutil.which("setpriv")


class Instances:
    """``width`` instances of one round, their output read (and dropped) on one thread."""

    def __init__(self, width: int, round_: int, marks: Path, reader: selectors.DefaultSelector):
        self.procs: list[subprocess.Popen] = []
        argv = instance_command("builtin", marks, width)
        prefix = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []
        for rank in range(width):
            env = dict(os.environ, RANK=str(rank), TRAINWARDEN_RESTART_ROUND=str(round_),
                       TRAINWARDEN_NODE=f"floor-{rank % 16}")
            proc = subprocess.Popen([*prefix, *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            os.set_blocking(proc.stdout.fileno(), False)
            reader.register(proc.stdout, selectors.EVENT_READ)
            self.procs.append(proc)

    def stop(self, reader: selectors.DefaultSelector) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.wait()
            try:
                reader.unregister(proc.stdout)
            except (KeyError, ValueError):
                pass
            proc.stdout.close()


def _read_forever(reader: selectors.DefaultSelector, lock: threading.Lock) -> None:
    while True:
        with lock:
            ready = reader.select(0.05) if reader.get_map() else []
        if not ready:
            time.sleep(0.01)
        for key, _ in ready:
            try:
                os.read(key.fd, 65536)
            except (BlockingIOError, OSError):
                pass


def measure(width: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"tw-floor-{width}-"))
    marks = tmp / "marks"
    marks.mkdir()
    reader, lock = selectors.DefaultSelector(), threading.Lock()
    threading.Thread(target=_read_forever, args=(reader, lock), daemon=True).start()
    try:
        started = time.time()
        with lock:
            round0 = Instances(width, 0, marks, reader)
        while len(_times(marks, "start-0-")) < width:
            time.sleep(0.02)
        round0_s = max(_times(marks, "start-0-").values()) - started
        while round0.procs[0].poll() is None:  # rank 0 crashes 4 lines after every instance started
            time.sleep(0.001)
        busy = _machine_busy_s(), time.monotonic()
        with lock:
            round0.stop(reader)
            stopped = time.time()
            round1 = Instances(width, 1, marks, reader)
        while len(_times(marks, "start-1-")) < width:
            time.sleep(0.02)
        done = _machine_busy_s(), time.monotonic()
        crash = _times(marks, "crash")["crash"]
        starts1 = _times(marks, "start-1-")
        with lock:
            round1.stop(reader)
        return {"instances": width, "round0_s": round0_s, "crash_to_first_s": min(starts1.values()) - crash,
                "crash_to_all_s": max(starts1.values()) - crash, "stop_s": stopped - crash,
                "machine_cpu_s": done[0] - busy[0], "busy_cores": (done[0] - busy[0]) / (done[1] - busy[1])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512,1024", help="comma-separated widths (default 512,1024)")
    parser.add_argument("--json", action="store_true", help="one JSON object per size instead of the table")
    args = parser.parse_args()
    try:
        sizes = [int(part) for part in args.sizes.split(",") if part]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not comma-separated widths (e.g. 512,1024)")
    print(f"machine: {os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}", file=sys.stderr)
    if not args.json:
        print("  inst  round 0   first     all    stop  all cpu    busy")
    for width in sizes:
        row = measure(width)
        print(json.dumps(row) if args.json else
              f"{row['instances']:6d}  {row['round0_s']:7.2f}  {row['crash_to_first_s']:6.2f}  "
              f"{row['crash_to_all_s']:6.2f}  {row['stop_s']:6.2f}  {row['machine_cpu_s']:7.2f}  "
              f"{row['busy_cores']:6.2f}", flush=True)
    print("times in seconds: round 0 = first start -> all started; first/all = crash -> round 1 started; "
          "stop = crash -> round 0 reaped; all cpu = the machine's CPU seconds from the crash to all started",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
