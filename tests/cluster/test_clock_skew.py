"""Clocks that disagree, on a real Kafka broker (TRAINWARDEN_KAFKA): agents
whose wall clocks are an hour or 4 s ahead or behind (libfaketime, as a host
whose NTP is wrong), and a `submit` an hour ahead. A hang is decided an
interval after the last line, a healthy job is never declared hung, and on
signed messages a skewed process's messages and a skewed consumer's reading
are taken (issue 29, break 3)."""

from __future__ import annotations

import sys

import pytest

from tests.cluster.processes import ServiceProcesses, behave, skewed_clock

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SKEWS = ("-1h", "-4", "+4", "+1h")  # one agent each
INTERVAL_S = 5
TICK_S = 0.2
# Lines reach the processor in the agent's 0.2 s batches, fetched at most 0.1 s
# late, on a CI host shared with the other services: what silence is measured
# from is when they arrive there.
WAY_S = 1.0
HANG_ARGS = f"--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval={INTERVAL_S}"

# Round 0 prints for 3 s, marks when its last line went out (the file's time
# is the kernel's: no libfaketime in it) and hangs; round 1 finishes at once.
HANGS = """
import os, pathlib, sys, time
if os.environ["TRAINWARDEN_RESTART_ROUND"] != "0":
    print("round", os.environ["TRAINWARDEN_RESTART_ROUND"], "done", flush=True)
    sys.exit(0)
for step in range(15):
    print("step", step, flush=True)
    time.sleep(0.2)
print("last line", flush=True)
pathlib.Path(sys.argv[1], "last-" + os.environ["RANK"]).touch()
time.sleep(600)
"""
HEALTHY = """
import time
for step in range(40):
    print("step", step, flush=True)
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def skewed(bootstrap, tmp_path_factory):
    """Four agents of one slot each, their clocks -1 h, -4 s, +4 s and +1 h off: a
    job of four instances has one on each."""
    agent_env = {index: skewed_clock(offset) for index, offset in enumerate(SKEWS)}
    services = ServiceProcesses(bootstrap, tmp_path_factory.mktemp("skewed"), nodes=len(SKEWS), slots=1,
                                agent_env=agent_env)
    try:
        yield services
    finally:
        services.stop()


def _run(services, job_id: str, args: str, program: str, *program_args: str, timeout: float = 180) -> str:
    proc = services.submit("--job-id", job_id, "--nproc", str(len(SKEWS)), "--args", args, "--",
                           sys.executable, "-c", program, *program_args)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    return out


def _faults(services, job_id: str) -> list[dict]:
    return [r for r in services.history(job_id) if r["action"] != "start_job"]


def test_a_hang_across_agents_with_skewed_clocks_is_decided_an_interval_after_the_last_line(skewed, job_id):
    marks = skewed.tmp / f"marks-{job_id}"
    marks.mkdir()
    out = _run(skewed, job_id, HANG_ARGS, HANGS, str(marks))
    assert out.count("last line") == len(SKEWS) and out.count("done") == len(SKEWS), out[-3000:]
    [hang] = [r for r in _faults(skewed, job_id) if r["result"] == "done"]
    assert (hang["action"], hang["error_source"], hang["round"]) == ("restart_job", "hang", 0), hang
    last_line = max(path.stat().st_mtime for path in marks.glob("last-*"))
    late = hang["time"] - last_line
    print(f"hang decided {late:.2f} s after the last line (interval {INTERVAL_S} s)")
    assert INTERVAL_S - 0.05 <= late <= INTERVAL_S + TICK_S + WAY_S, (late, skewed.logs())


def test_a_healthy_job_across_agents_with_skewed_clocks_is_never_declared_hung(skewed, job_id):
    out = _run(skewed, job_id, HANG_ARGS, HEALTHY)
    assert out.count("step 39") == len(SKEWS)
    assert _faults(skewed, job_id) == []


# ---------------------------------------------------------------- signed


@pytest.fixture(scope="module")
def signed_skewed(bootstrap, tmp_path_factory):
    """Signed messages; one agent an hour ahead (it reads commands the
    actuator signed an hour "before" its clock), one 4 s behind."""
    tmp = tmp_path_factory.mktemp("signed-skewed")
    keyring = tmp / "signing.keyring"
    keyring.write_text("k1 " + "c" * 20 + "clockskew" * 3 + "\n")
    keyring.chmod(0o600)
    with pytest.MonkeyPatch.context() as env:
        for name in ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_TRUSTED_NETWORK", "TRAINWARDEN_SIGNING_MAX_AGE"):
            env.delenv(name, raising=False)
        env.setenv("TRAINWARDEN_SIGNING_KEY_FILE", str(keyring))
        services = ServiceProcesses(bootstrap, tmp, nodes=2, agent_env={0: skewed_clock("+1h"),
                                                                        1: skewed_clock("-4")})
        try:
            yield services
        finally:
            services.stop()


@pytest.mark.parametrize("offset", ["+1h", "-4"])
def test_a_signed_submit_from_a_process_whose_clock_is_off_runs_on_agents_whose_clocks_are_off(
        signed_skewed, job_id, offset):
    proc = signed_skewed.submit("--job-id", job_id, "--nproc", "2", "--", *behave("--steps", "5"),
                                extra_env=skewed_clock(offset))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, signed_skewed.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    assert "hello worker-0" in out and "hello worker-1" in out
    assert "expired" not in signed_skewed.logs()


def test_every_topic_records_the_brokers_append_time(signed_skewed):
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=signed_skewed.bootstrap, consumer_timeout_ms=10000)
    topic = signed_skewed.topic("nodes")  # heartbeats: never empty
    partitions = [TopicPartition(topic, p) for p in reader.partitions_for_topic(topic)]
    reader.assign(partitions)
    reader.seek_to_beginning(*partitions)
    record = next(iter(reader))
    reader.close()
    assert record.timestamp_type == 1  # LogAppendTime: the broker's clock, which no producer sets
