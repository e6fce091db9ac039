"""Shared fixtures: a CLI runner, builders, and the orphan check.

Every job a test starts gets an id beginning with ``twtest-``; after each test
no live process may carry such a TRAINWARDEN_JOB_ID in its environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINWARDEN = [sys.executable, "-m", "trainwarden.cli.main"]
# Unique per test session: the orphan check must only ever see (and kill) the
# processes of this session's jobs, not those of another run on the machine.
JOB_PREFIX = f"twtest-{uuid.uuid4().hex[:6]}-"


def job_processes(prefix: str = JOB_PREFIX) -> list[tuple[int, str]]:
    """Live (not zombie) processes started for a test job."""
    found = []
    marker = f"TRAINWARDEN_JOB_ID={prefix}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if marker not in environ:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "?")
        if state != "Z":
            found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]))
    return found


# ``make test`` runs these in a serial pass after the rest (-m alone):
# bounds of a notice (2 s to save a checkpoint) and of Slurm's own timing
# that a test on the other xdist worker stretched (4 of them failed so).
ALONE = ("tests/slurm/",)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by this mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(ROOT).as_posix().startswith(ALONE):
            item.add_marker(pytest.mark.alone)


@pytest.fixture(autouse=True)
def no_orphans_after_test():
    yield
    deadline = time.time() + 5
    left = job_processes()
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = job_processes()
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        pytest.fail(f"orphan processes survived the test: {left}")


@pytest.fixture(autouse=True)
def no_kafka_flags_after_test():
    # A parse of `--kafka-sasl-*` flags in this process (tests/deploy parses the
    # manifests' commands) hands them to every later bus (kafka_security.set_by_flag).
    from trainwarden.bus import kafka_security

    given = dict(kafka_security._FLAG_VALUES)
    yield
    kafka_security._FLAG_VALUES.clear()
    kafka_security._FLAG_VALUES.update(given)


class Completed:
    def __init__(self, proc: subprocess.CompletedProcess, elapsed: float):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.elapsed = elapsed

    def __repr__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-4000:]}\n--- stderr\n{self.err[-4000:]}"


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def cli(store):
    """Run ``trainwarden`` as a real process with this test's store."""

    def run(*args: str, timeout: float = 120, env: dict | None = None, input: str | None = None) -> Completed:
        full_env = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"))
        full_env.update(env or {})
        started = time.time()
        proc = subprocess.run([*TRAINWARDEN, *args], capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=ROOT, input=input)
        return Completed(proc, time.time() - started)

    return run


@pytest.fixture
def job_id() -> str:
    return f"{JOB_PREFIX}{uuid.uuid4().hex[:8]}"


@pytest.fixture
def history(cli):
    def read(job: str, *extra: str) -> list[dict]:
        result = cli("history", "--job", job, "--json", *extra)
        assert result.code == 0, result
        return json.loads(result.out)

    return read


@pytest.fixture(scope="session")
def bootstrap() -> str:
    """The broker the Kafka tests run against; they skip, saying how to start one, without it."""
    value = os.environ.get("TRAINWARDEN_KAFKA")
    if not value:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    return value
