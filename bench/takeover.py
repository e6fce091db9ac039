"""How soon a killed service is replaced, on the Kafka cluster shape (issue 26, item 3).

Real services as processes on this machine (two agents, two processors, one
actuator, topics of their own), a job of two ``sh`` instances that print a
line every 0.1 s (tests/cluster/takeover.py, the scenarios the takeover tests
assert). Times are this process's monotonic clock. Printed, the median of
``--runs`` runs (each on fresh services), with every run's figure:

  processor SIGKILL -> decision   the job's processor killed and a rank crashing
                                  at once -> the survivor's restart_job on the bus
  hang due in a takeover          seconds of silence before job_hang (interval 5 s,
                                  the processor killed 2 s into the silence)
  actuator SIGKILL -> new round   the actuator killed, a rank crashing, a new
                                  actuator started at once -> every instance of
                                  round 1 started
  agent SIGKILL+restart, crash     the agent of rank 1's node killed and started
    -> new round                  again at once; 12 s later (past --node-timeout
                                  10 s: its instances were taken back) rank 1
                                  crashes -> every instance of round 1 started
  broker outage -> ready / acted  with --outage S (once; needs KAFKA_DATA_DIR of
                                  the local-kafka broker: it is stopped): the broker
                                  back -> every service's /readyz 200, and -> the
                                  round a crash during the outage calls for started

    .venv/bin/python bench/takeover.py [--bootstrap HOST:PORT] [--runs 3] [--outage 30] [--json]

Needs a broker (deploy/kafka/local-kafka start; TRAINWARDEN_KAFKA or
--bootstrap). TRAINWARDEN_KAFKA_SESSION_TIMEOUT_MS=10000 gives the consumers'
sessions of before (heartbeat 1 s), for the "before" column. Not a test:
docs/PERFORMANCE.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster.processes import ServiceProcesses  # noqa: E402
from tests.cluster.takeover import (  # noqa: E402
    Services,
    actuator_restart,
    agent_restart,
    broker_outage,
    hang_during_takeover,
    processor_takeover,
    wait_for,
)

HANG_INTERVAL_S = 5


def _on_fresh_services(bootstrap: str, measure) -> float:
    with tempfile.TemporaryDirectory(prefix="tw-takeover-") as tmp:
        services = Services(bootstrap, Path(tmp), nodes=2, node_timeout_s=10.0)
        try:
            services.start_second_processor()
            wait_for(services.settled, 60, "two processors holding two events partitions each")
            return measure(services, f"bench-{uuid.uuid4().hex[:8]}", Path(tmp) / "work")
        finally:
            services.stop()


SCENARIOS = {
    "processor SIGKILL -> decision": processor_takeover,
    "hang due in a takeover (interval 5 s)": lambda s, j, w: hang_during_takeover(s, j, w, HANG_INTERVAL_S),
    "actuator SIGKILL -> new round": actuator_restart,
    "agent SIGKILL+restart, crash -> new round": lambda s, j, w: agent_restart(s, j, w, 10.0)[0],
}


def _outage(bootstrap: str, outage_s: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="tw-takeover-") as tmp:
        services = ServiceProcesses(bootstrap, Path(tmp), nodes=2, metrics=True, node_timeout_s=10.0)
        try:
            return broker_outage(services, f"bench-{uuid.uuid4().hex[:8]}", Path(tmp) / "work", outage_s)
        finally:
            services.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("TRAINWARDEN_KAFKA", ""))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--outage", type=float, default=0.0,
                        help="also stop the broker this many seconds (KAFKA_DATA_DIR names its data directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("no broker: pass --bootstrap HOST:PORT or set TRAINWARDEN_KAFKA (deploy/kafka/local-kafka start)")
    from trainwarden.bus.kafka import session_timeout_ms

    session_ms, _ = session_timeout_ms()
    figures = {}
    for name, measure in SCENARIOS.items():
        runs = [round(_on_fresh_services(args.bootstrap, measure), 2) for _ in range(args.runs)]
        figures[name] = {"median_s": round(statistics.median(runs), 2), "runs_s": runs}
        if not args.json:
            print(f"{name:<40} {figures[name]['median_s']:6.2f} s   runs {runs}", flush=True)
    if args.outage:
        if not os.environ.get("KAFKA_DATA_DIR"):
            parser.error("--outage stops the broker: set KAFKA_DATA_DIR to its local-kafka data directory")
        ready, acted = _outage(args.bootstrap, args.outage)
        for what, took in (("ready", ready), ("acted", acted)):
            figures[f"broker outage {args.outage:.0f} s -> {what}"] = {"median_s": round(took, 2),
                                                                      "runs_s": [round(took, 2)]}
        if not args.json:
            print(f"{'broker outage -> every service ready':<40} {ready:6.2f} s", flush=True)
            print(f"{'broker outage -> held-back crash acted':<40} {acted:6.2f} s", flush=True)
    if args.json:
        print(json.dumps({"session_timeout_ms": session_ms, "figures": figures}, indent=1))
    else:
        print(f"(consumer sessions asked for: {session_ms} ms; median of {args.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
