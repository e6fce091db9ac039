"""Notification throughput: engine decisions -> signed webhooks to a local receiver.

Submits N restart decisions of N different jobs (no rate limiting applies
across jobs) to one subscription and measures how long ``submit`` takes (it
returns once the delivery is durable on disk) and how long until the receiver
has every event.

    .venv/bin/python bench/notify.py [--events 2000]
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipeline"))

from trainwarden.events import Decision, DecisionKind, ErrorSource, Reason  # noqa: E402
from trainwarden.notify import MemoryDeliveryLog, Notifier, load_subscriptions  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"bench-signing-key-0123456789abcdef").decode()


class Counting(BaseHTTPRequestHandler):
    received = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
        with Counting.lock:
            Counting.received += 1

    def log_message(self, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000)
    events = parser.parse_args().events
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        subs_dir = Path(tmp) / "subs"
        subs_dir.mkdir()
        (subs_dir / "ops.yaml").write_text(
            "version: 1\nsubscriptions:\n  - name: ops\n    target:\n"
            f"      url: http://127.0.0.1:{server.server_port}/hook\n      allow_private_targets: true\n"
            "    secret: ${BENCH_SECRET}\n    rate_limit: {interval_s: 0}\n")
        notifier = Notifier(load_subscriptions(subs_dir), Path(tmp) / "queue", writer=MemoryDeliveryLog(),
                            env={"BENCH_SECRET": SECRET})
        notifier.start()
        submit_ms = []
        started = time.perf_counter()
        for i in range(events):
            decision = Decision(kind=DecisionKind.RESTART_JOB, reason=Reason.RETRYABLE_FAILURE, rule="bench",
                                job_id=f"job-{i}", time=1_764_400_000.0 + i, round=0, action_id=f"bench-{i}",
                                error_source=ErrorSource.INSTANCE_EXIT, instance="worker-1", error_code=1,
                                error_message="RuntimeError: NCCL error: unhandled system error")
            t0 = time.perf_counter()
            notifier.submit_decision(decision, {"framework": "pytorch"})
            submit_ms.append((time.perf_counter() - t0) * 1000)
        notifier.drain(300)
        elapsed = time.perf_counter() - started
        notifier.close()
    server.shutdown()
    submit_ms.sort()
    print(f"{events} events, {Counting.received} received in {elapsed:.2f} s: {Counting.received / elapsed:,.0f} "
          f"deliveries/s (signed, durable queue, one subscription in order)")
    print(f"submit (durable on return): p50 {statistics.median(submit_ms):.2f} ms, "
          f"p99 {submit_ms[int(len(submit_ms) * 0.99) - 1]:.2f} ms")


if __name__ == "__main__":
    main()
