"""A hostile job against the channels that speak for others, on the cluster
shape (real agents, processor and actuator on a real Kafka broker,
TRAINWARDEN_KAFKA): the agent's C4D socket and another job's SDK endpoint."""

import os
import subprocess
import sys
import time

import pytest

from tests.cluster.processes import services_on_broker
from tests.e2e.test_channels_bound import C4D_WRITER, FORGED, THIEF, VICTIM

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


@pytest.fixture
def services(tmp_path):
    yield from services_on_broker(tmp_path, nodes=2)


def _program(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _submit(services, job_id, args, program, *argv):
    return services.submit("--job-id", job_id, "--nproc", "1", "--args", args, "--", sys.executable, program, *argv)


def _finish(services, proc):
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    return out


def _letters(services, channel):
    from trainwarden.store import open_reader

    with open_reader(services.store) as reader:
        return [d for d in reader.dead_letters(limit=1000) if d["source"].endswith("/" + channel)]


def test_a_job_writing_c4d_errors_to_its_agents_c4d_socket_gets_no_node_isolated(services, job_id, tmp_path):
    proc = _submit(services, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                   "--enable-c4d-hang-detection=True", _program(tmp_path, "writer.py", C4D_WRITER),
                   "my-agents", FORGED)
    out = _finish(services, proc)
    assert "instance wrote its line" in out and "daemon wrote its line" in out, out
    assert "c4d socket in my environment: False" in out, out
    assert [r for r in services.history(job_id) if r["result"] == "done"] == []
    letters = _letters(services, "c4d")
    # The actuator writes the agents' dead letters as they come: wait for both.
    for _ in range(100):
        if len(letters) >= 2:
            break
        time.sleep(0.3)
        letters = _letters(services, "c4d")
    assert len(letters) == 2, letters
    assert all("C4D line refused" in d["error"] and FORGED in d["payload"] for d in letters), letters
    assert f"a process of job {job_id}'s instance worker-0" in " ".join(d["error"] for d in letters)


def test_a_process_of_another_job_cannot_use_a_jobs_sdk_on_the_cluster(services, job_id, tmp_path):
    victim, thief, flag = f"{job_id}-a", f"{job_id}-b", tmp_path / "thief-is-done"
    a = _submit(services, victim, "--enable-job-restart=True --enable-job-hang-detection=True "
                "--job-hang-interval=3", _program(tmp_path, "victim.py", VICTIM), str(flag))
    b = _submit(services, thief, "", _program(tmp_path, "thief.py", THIEF), victim, str(flag))
    b_out, a_out = _finish(services, b), _finish(services, a)
    lines = [line.split("] ", 1)[-1] for line in b_out.splitlines()]
    said = dict(line.split(": ", 1) for line in lines if line.startswith("B "))
    assert len(said) == 4, b_out
    # With A's token, by hand: refused whichever agent B runs on.
    assert '"ok": false' in said["B v1 with A\'s token"] and "version" in said["B v1 with A\'s token"]
    assert '"ok": false' in said["B v2 with A\'s token"] and "'token'" in said["B v2 with A\'s token"]
    # Through the SDK with A's socket: refused on another agent; on A's own
    # agent the calls are B's own (its process tree), never A's.
    for attempt in ("B custom message", "B hang detection off"):
        assert said[attempt].startswith("ERROR") or said[attempt].startswith("OK"), said
    assert "A restarted after its hang" in a_out, a_out
    records = services.history(victim)
    assert [(r["action"], r["error_source"]) for r in records if r["result"] == "done"] == [("restart_job", "hang")]
    assert not any("forged by B" in str(r) for r in records)


def test_an_agent_refuses_at_start_a_c4d_log_the_instances_user_can_write(tmp_path):
    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    from tests.conftest import ROOT, TRAINWARDEN

    log = tmp_path / "c4d.log"
    log.touch()
    done = subprocess.run([*TRAINWARDEN, "agent", "--node", "refusing", "--log-dir", str(tmp_path / "logs"),
                           "--c4d-log", str(log), "--bootstrap", bootstrap], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT / "pipeline")))
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done
    assert f"--c4d-log {log}" in said and "writable by the user the instances run as" in said, said
    assert "--c4d-socket" in said, said
