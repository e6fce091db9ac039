"""Issue 29, break 4: a job that floods what its node agent does for it, on
the cluster shape (real agents, processor and actuator on a real Kafka
broker, TRAINWARDEN_KAFKA). Its output files stay under their size; 20,000
SDK (and C4D) connection attempts leave the agent's files, memory, /metrics
and loop alone, and a legitimate SDK call is served during and after; 1,000
custom messages make a bounded number of history rows and webhooks, with the
dropped count."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cluster.processes import services_on_broker, wait_for
from tests.notify.conftest import ENV, receiver, subscription_yaml  # noqa: F401 - fixture

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MIB = 1024 * 1024

# Prints 4 KiB lines as fast as its pipe takes them for argv[1] seconds.
OUTPUT_FLOOD = textwrap.dedent('''
    import sys, time
    line = "flood " * 682 + "\\n"
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        sys.stdout.write(line)
    sys.stdout.flush()
    print("flood over", flush=True)
''')

# worker-0 connects to its SDK endpoint argv[1] times as fast as it can (a
# full backlog waited out, as a determined job would), holding the
# connections open, then floods the agent's C4D socket; then it makes a
# legitimate SDK call. worker-1, beside it on the same agent, makes SDK
# calls all along.
CONNECTION_FLOOD = textwrap.dedent('''
    import os, resource, socket, sys, time
    from trainwarden.sdk import job_monitor as jm

    attempts, done = int(sys.argv[1]), sys.argv[2]
    if os.environ["RANK"] == "1":
        ok = calls = 0
        while not os.path.exists(done):
            calls += 1
            ok += jm.Monitor().report_progress(calls).ok()
            time.sleep(0.05)
        print(f"worker-1 calls during the flood: {ok} ok of {calls}", flush=True)
        sys.exit(0)

    def connect(path):
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
                return conn
            except BlockingIOError:  # the endpoint's backlog is full: try again
                conn.close()
            except OSError:
                conn.close()
                return None

    room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200
    held, failed = [], 0
    started = time.monotonic()
    for _ in range(attempts):
        conn = connect(os.environ["TRAINWARDEN_SDK_SOCKET"])
        if conn is None:
            failed += 1
            continue
        held.append(conn)
        if len(held) >= room:
            for c in held:
                c.close()
            held.clear()
    print(f"sdk flood: {attempts} attempts in {time.monotonic() - started:.1f} s, {failed} failed", flush=True)
    pid, c4d = os.getppid(), None
    while c4d is None and pid > 1:  # the agent that started me says where its C4D socket is
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
        if "--c4d-socket" in argv:
            c4d = argv[argv.index("--c4d-socket") + 1]
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    line = b'[C4D] level=Error kind=RankCommHang rank=0 node=elsewhere detail="flood"\\n'
    for _ in range(attempts // 4):
        conn = connect(c4d)
        if conn is not None:
            try:
                conn.sendall(line)
            except OSError:
                pass
            held.append(conn)
            if len(held) >= room:
                for c in held:
                    c.close()
                held.clear()
    for c in held:
        c.close()
    print("c4d flood over", flush=True)
    print("legitimate call after the flood:", jm.Monitor().report_progress(1).to_string(), flush=True)
    open(done, "w").close()
''')


@pytest.fixture
def small_files(tmp_path, monkeypatch):
    # The agent's own flags, from the environment (as in a container spec).
    monkeypatch.setenv("TRAINWARDEN_LOG_FILE_MAX_MB", "1")
    monkeypatch.setenv("TRAINWARDEN_NO_SHIP_LOGS", "1")  # Vector's mode: the files are the log path
    yield from services_on_broker(tmp_path, nodes=1, metrics=True)


@pytest.fixture
def one_agent(tmp_path):
    yield from services_on_broker(tmp_path, nodes=1, slots=2, metrics=True)


def _program(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _finish(services, proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    return out


def _metric(services, name: str) -> float:
    with urllib.request.urlopen(services.metrics_url(f"agent-{services.node_names[0]}"), timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not among the agent's metrics")


def _files(directory: Path) -> dict[str, int]:
    sizes = {}
    for path in directory.rglob("*"):
        try:
            sizes[path.name] = path.stat().st_size
        except OSError:
            pass  # rotated away meanwhile
    return sizes


def test_a_job_flooding_its_output_cannot_make_its_agents_files_pass_their_size(small_files, job_id, tmp_path):
    services = small_files
    node = services.node_names[0]
    proc = services.submit("--job-id", job_id, "--args", "", "--", sys.executable,
                           _program(tmp_path, "flood.py", OUTPUT_FLOOD), "10")
    where = services.tmp / f"logs-{node}" / job_id / "worker-0"
    largest = total = 0
    while proc.poll() is None:
        sizes = _files(where)
        largest, total = max(largest, *sizes.values(), 0), max(total, sum(sizes.values()))
        time.sleep(0.1)
    _finish(services, proc)
    sizes = _files(where)
    largest, total = max(largest, *sizes.values()), max(total, sum(sizes.values()))
    print(f"\nlargest output file {largest} bytes, all of the stream {total} bytes: {sorted(sizes.items())}")
    assert largest <= MIB, sizes
    assert set(sizes) <= {"r0-s0.stdout.log", "r0-s0.stdout.log.1", "r0-s0.stdout.log.2", "r0-s0.stderr.log"}
    assert total <= 3 * MIB + 4096, sizes
    assert _metric(services, "trainwarden_agent_log_rotations_total") >= 2
    # Past three files within 90 s, the rest of the flood was left out of the file, and counted.
    assert _metric(services, "trainwarden_agent_log_lines_unwritten_total") > 0


class _Watch:
    """Scrapes the agent's /metrics and reads its memory and open files, every 50 ms."""

    def __init__(self, services, pid: int):
        self.url = services.metrics_url(f"agent-{services.node_names[0]}")
        self.pid = pid
        self.scrapes = self.failed = 0
        self.slowest = self.rss_kib = self.fds = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
                status = Path(f"/proc/{self.pid}/status").read_text()
                self.rss_kib = max(self.rss_kib, int(status.split("VmRSS:")[1].split()[0]))
            except (OSError, IndexError):
                pass
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    answer.read()
                self.scrapes += 1
            except OSError as exc:
                self.failed += 1
                self.errors.append(repr(exc))
            self.slowest = max(self.slowest, time.monotonic() - started)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_20000_sdk_connection_attempts_leave_the_agents_files_metrics_and_other_calls_alone(
        one_agent, job_id, tmp_path):
    services = one_agent
    node = services.node_names[0]
    agent = services.procs[f"agent-{node}"]
    baseline = len(os.listdir(f"/proc/{agent.pid}/fd"))
    watch = _Watch(services, agent.pid)
    proc = services.submit("--job-id", job_id, "--nproc", "2", "--args", "", "--", sys.executable,
                           _program(tmp_path, "connect.py", CONNECTION_FLOOD), "20000", str(tmp_path / "done"))
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        watch.stop()
    print(f"\nagent during 20,000 SDK + 5,000 C4D connection attempts: at most {watch.fds:.0f} open files "
          f"(before: {baseline}), RSS at most {watch.rss_kib / 1024:.1f} MiB; /metrics answered {watch.scrapes} "
          f"times, slowest {watch.slowest:.2f} s, failed {watch.failed}")
    print([line for line in out.splitlines() if "flood" in line or "call" in line])
    assert watch.failed == 0 and watch.scrapes > 0, watch.errors[:5]
    assert watch.fds < baseline + 300, watch.fds  # the endpoint's caps, far below the 20,000 it used to reach
    assert agent.poll() is None
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    assert "legitimate call after the flood: OK" in out, out
    during = next(line for line in out.splitlines() if "worker-1 calls during the flood" in line)
    ok, calls = (int(n) for n in during.rsplit(": ", 1)[1].split(" ok of "))
    assert ok == calls and calls > 0, during
    assert _metric(services, "trainwarden_agent_sdk_refused_total") > 1000
    assert _metric(services, "trainwarden_agent_c4d_refused_total") > 100


# 1,000 custom messages, as fast as the SDK takes them.
MESSAGES = textwrap.dedent('''
    import time
    from trainwarden.sdk import job_monitor as jm

    monitor, started = jm.Monitor(), time.monotonic()
    ok = sum(monitor.send_custom_message(content=f"message {i}").ok() for i in range(1000))
    print(f"{ok} of 1000 messages taken in {time.monotonic() - started:.1f} s", flush=True)
''')


def test_1000_custom_messages_make_bounded_rows_and_webhooks_that_say_how_many_were_dropped(
        one_agent, job_id, tmp_path, receiver):  # noqa: F811 - the fixture
    services = one_agent
    hook = receiver()
    directory = tmp_path / "notifications"
    directory.mkdir()
    # The per-type limit off (the flood's own type would be held to one a minute otherwise);
    # the per-job limit at 10 messages per 10 s to keep the test short.
    (directory / "ops.yaml").write_text("version: 1\nsubscriptions:\n" + subscription_yaml(
        "ops", hook.url, private=True, rate=0, extra="  job_limit: {max_messages: 10, interval_s: 10}\n"))
    services.env.update(ENV)
    services.start("notifier", "--notifications", str(directory), "--notify-dir", str(tmp_path / "queue"),
                   "--store", str(services.store))
    time.sleep(3.0)  # its group joined
    proc = services.submit("--job-id", job_id, "--args", "", "--", sys.executable,
                           _program(tmp_path, "messages.py", MESSAGES))
    out = _finish(services, proc)
    assert "1000 of 1000 messages taken" in out, out
    print("\n" + next(line for line in out.splitlines() if "messages taken" in line))

    def rows():
        return [r for r in services.history(job_id) if r["category"].startswith("custom_message")]

    wait_for(lambda: len(rows()) >= 31, 60, "the job's custom message rows")
    found = rows()
    kept = [r for r in found if r["rule"] == "sdk_custom_message"]
    assert len(kept) == 30, len(kept)
    [dropped] = [r for r in found if r["rule"] == "custom_messages_dropped"]
    assert dropped["error_message"].startswith("970 custom messages of this job dropped"), dropped
    def sent():
        return list({r.webhook_id: json.loads(r.body) for r in hook.requests}.values())

    def customs():
        return [m["data"] for m in sent() if m["type"] == "custom.message"]

    # Each of the engine's 31 custom-message events is sent, or counted in a sent one's suppressed_count.
    wait_for(lambda: sum(1 + m["suppressed_count"] for m in customs()) == 31
             and "job.succeeded" in [m["type"] for m in sent()], 60, "every event sent or counted")
    time.sleep(2.0)  # nothing more comes
    print(f"\n1,000 custom messages: {len(found)} history rows, {len(sent())} webhooks")
    # The job's first window: 10 messages; then the latest held of each type when it ends, and
    # the dropped count's row (with job.succeeded) in a later window if the job outlasts it.
    assert len(customs()) <= 12 and len(sent()) <= 13, [m["type"] for m in sent()]
    assert sum(1 + m["suppressed_count"] for m in customs()) == 31, customs()
    assert customs()[-1]["message"].startswith("970 custom messages of this job dropped"), customs()[-1]
