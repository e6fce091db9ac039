"""The distributed services as real processes against a real Kafka broker."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRAINWARDEN

KAFKA_SCRIPT = ROOT / "deploy" / "kafka" / "local-kafka"
# libfaketime, where Debian's and Fedora's `faketime` packages put it.
FAKETIME_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/faketime/libfaketime.so.1", "/usr/lib64/faketime/libfaketime.so.1")


def skewed_clock(offset: str) -> dict[str, str]:
    """The environment that runs a process (and its children) with its wall
    clock ``offset`` off ("+1h", "-4"), as on a host whose NTP is wrong:
    libfaketime on the wall clock only, the monotonic clock left true (and
    faketime/sitecustomize.py, for Python's sleep under it). The test skips,
    saying why, when libfaketime is not installed."""
    library = next((path for path in FAKETIME_LIBRARIES if Path(path).exists()), None)
    if library is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime): the clock-skew tests need it to skew "
                    "one process's clock")
    return {"LD_PRELOAD": library, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join((str(Path(__file__).parent / "faketime"), str(ROOT / "pipeline")))}


class ServiceProcesses:
    def __init__(self, bootstrap: str, tmp: Path, nodes: int = 3, slots: int = 2, node_timeout_s: float = 5.0,
                 slurm_dir: Path | None = None, metrics: bool = False, rules: Path | None = None,
                 agent_args: tuple[str, ...] = (), user: int | None = None, python: str = sys.executable,
                 agent_env: dict[int, dict[str, str]] | None = None):
        """slurm_dir: the agents are those of the local Slurm cluster's nodes
        (n1..n3), and the actuator runs --runtime slurm jobs through Slurm.
        metrics: every service serves /metrics, /healthz and /readyz on a port
        of its own (``metrics_url``). rules: the processor's --rules.
        agent_args: more options of every agent (--run-as). user: the uid
        (and gid) every service runs as, with ``python`` (one that user can
        run; tests/other_user.py), in a ``tmp`` that user can write.
        agent_env: more environment for the agent of node number N (from 0),
        e.g. ``skewed_clock("+1h")``. node_timeout_s: the actuator's
        --node-timeout; heartbeats come every second, and with 3 s a Slurm
        test beside another one once lost a node that was there."""
        self.user = user
        self.command = [python, "-m", "trainwarden.cli.main"]
        self.agent_args = tuple(agent_args)
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.metrics_ports: dict[str, int] = {}
        self.rules = rules
        self.slurm_dir = slurm_dir
        self.tmp = tmp
        self.store = tmp / "store"
        self.prefix = f"n{uuid.uuid4().hex[:5]}"
        self.slots = slots
        self.node_timeout_s = node_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.followers: list[subprocess.Popen] = []  # submit --follow processes
        # Topics of its own: no job, node or committed offset of another test can reach it.
        self.topic_prefix = f"twt{uuid.uuid4().hex[:8]}"
        self.env = dict(os.environ, TRAINWARDEN_KAFKA=bootstrap, PYTHONPATH=str(ROOT / "pipeline"),
                        TRAINWARDEN_STORE=str(self.store), TRAINWARDEN_TOPIC_PREFIX=self.topic_prefix)
        if user is not None:
            from tests.other_user import python_path

            self.env.update(PYTHONPATH=python_path(), HOME=str(tmp))
        subprocess.run([*TRAINWARDEN, "kafka", "init", "--partitions", "4"], env=self.env, cwd=ROOT, check=True,
                       capture_output=True, timeout=120)
        self.node_names = [f"n{i + 1}" if slurm_dir else f"{self.prefix}-{i}" for i in range(nodes)]
        for index, name in enumerate(self.node_names):
            extra = (agent_env or {}).get(index)
            if extra:
                self.start_agent(name, extra)
            else:
                self.start_agent(name)  # as subclasses that wrap it (test_kafka_security.py) call it
        self.start("processor")
        self.start("actuator")
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Every agent reporting in (its commands read from then on) and the
        processor holding its partitions, as their logs say; then two
        heartbeats' time for the actuator to hear every node. A fixed 4 s was
        too short on a loaded machine: a command sent then never ran."""
        wanted = {f"agent-{node}": "reporting in (" for node in self.node_names}
        wanted["processor"] = "events partitions"

        def said(name: str, text: str) -> bool:
            try:
                return text in (self.tmp / f"{name}.log").read_text(errors="replace")
            except FileNotFoundError:
                return False

        deadline = time.time() + timeout_s
        while not all(said(name, text) for name, text in wanted.items()):
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited ({proc.returncode}) before it was ready\n{self.logs()}")
            if time.time() > deadline:
                missing = [name for name, text in wanted.items() if not said(name, text)]
                raise AssertionError(f"not ready after {timeout_s:.0f} s: {missing}\n{self.logs()}")
            time.sleep(0.1)
        time.sleep(2.0)

    def start(self, name: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
        """env: variables for this process only (a failpoint, say)."""
        if name == "actuator":
            args = ["actuator", "--store", str(self.store), "--node-timeout", str(self.node_timeout_s)]
            if self.slurm_dir:
                args += ["--slurm-dir", str(self.slurm_dir)]
        elif name == "processor" and self.rules is not None:
            args = [name, "--rules", str(self.rules)]
        else:
            args = [name]
        args += self._metrics_args(name)
        log = open(self.tmp / f"{name}.log", "ab")
        env = {**self.env, **(env or {})}
        if os.environ.get("TRAINWARDEN_TEST_KAFKA_DEBUG"):
            env["TRAINWARDEN_KAFKA_DEBUG"] = str(self.tmp / f"{name}.kafka-debug")
        proc = subprocess.Popen([*self.command, *args, *extra], env=env, cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, **self._as_user())
        self.procs[name] = proc
        return proc

    def start_agent(self, node: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"agent-{node}.log", "ab")
        env = dict(self.env, **(extra_env or {}))
        if os.environ.get("TRAINWARDEN_TEST_KAFKA_DEBUG"):
            env["TRAINWARDEN_KAFKA_DEBUG"] = str(self.tmp / f"agent-{node}.kafka-debug")
        import queue
        import tempfile
        import threading

        from trainwarden.runtime.c4d_source import FileFollower, forward

        # C4D's own log (tests write findings to it) and the agent's C4D socket
        # (short: a Unix socket path holds at most 108 bytes).
        c4d_log = self.tmp / f"c4d-{node}.log"
        c4d_log.touch()
        c4d_socket = Path(tempfile.gettempdir()) / f"tw-c4d-{self.prefix}-{node}.sock"
        proc = subprocess.Popen([*self.command, "agent", "--node", node, "--slots", str(self.slots),
                                 "--log-dir", str(self.tmp / f"logs-{node}"), "--address", "127.0.0.1",
                                 "--c4d-socket", str(c4d_socket),
                                 *(["--slurm-dir", str(self.slurm_dir)] if self.slurm_dir else []),
                                 *self._metrics_args(f"agent-{node}"), *self.agent_args],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, **self._as_user())
        self.procs[f"agent-{node}"] = proc
        # C4D's collector for as long as this agent lives: this test process,
        # which no job started, forwards what is written to c4d-NODE.log.
        pending: queue.Queue = queue.Queue()
        agent_gone = threading.Event()
        follower = FileFollower(c4d_log, pending.put)

        def collect() -> None:
            forward(str(c4d_socket), pending, agent_gone)
            follower.close()

        threading.Thread(target=collect, name=f"c4d-collector-{node}", daemon=True).start()
        threading.Thread(target=lambda: (proc.wait(), agent_gone.set()), daemon=True).start()
        return proc

    def _as_user(self) -> dict:
        return {} if self.user is None else {"user": self.user, "group": self.user, "extra_groups": []}

    def _metrics_args(self, name: str) -> list[str]:
        if not self.metrics:
            return []
        # A restarted service keeps its port: a test scrapes the same address.
        port = self.metrics_ports.setdefault(name, free_port())
        return ["--metrics-address", f"127.0.0.1:{port}"]

    def metrics_url(self, name: str, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.metrics_ports[name]}{path}"

    def topic(self, kind: str) -> str:
        """This test's topic of a kind: logs, events, decisions, commands, nodes, actuator, deadletter."""
        return f"{self.topic_prefix}.{kind}"

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.procs.items()}

    def submit(self, *args: str, timeout: float = 180, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([*TRAINWARDEN, "submit", "--follow", *args], env=dict(self.env, **(extra_env or {})),
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Ended with the services: a test that fails before it reads the
        # follower's end would leave it following for ever.
        self.followers.append(proc)
        return proc

    def history(self, job_id: str) -> list[dict]:
        out = subprocess.run([*TRAINWARDEN, "history", "--job", job_id, "--json", "--wide", "--store",
                              str(self.store)], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop(self) -> None:
        for proc in self.followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a service restarted on its
    old port (a test scrapes the same address) must not find it taken by some
    process's outgoing connection, which an ephemeral port can be (CI saw a
    restarted notifier never deliver)."""
    low, _ = _ephemeral_range()
    taken = {9092, 19092, 29092}  # the brokers the tests and CI start
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        if port in taken or (17000 <= port < 17100):  # the local Slurm's ports
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def behave(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "e2e" / "programs" / "behave.py"), *args]


def services_on_broker(tmp: Path, **options):
    """For a fixture (``yield from``): the services on TRAINWARDEN_KAFKA's
    broker, stopped at the end; without a broker the test skips."""
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    services = ServiceProcesses(bootstrap, tmp, **options)
    try:
        yield services
    finally:
        services.stop()
