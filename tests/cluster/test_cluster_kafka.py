"""Acceptance of the distributed shape: node agents, processor and actuator
as separate processes on a real Kafka broker (TRAINWARDEN_KAFKA; .ci/run
starts one from deploy/kafka)."""

import json
import os
import subprocess
import time

import pytest

from trainwarden.bus import open_bus
from trainwarden.diagnose.collect import find_tool
from trainwarden.bus.serde import encode
from tests.cluster.processes import ServiceProcesses, behave, wait_for
from tests.conftest import TRAINWARDEN

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NCCL = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error"


@pytest.fixture
def services(bootstrap, tmp_path):
    s = ServiceProcesses(bootstrap, tmp_path)
    yield s
    s.stop()


def _submit(services, job_id, args, *program, nproc=2):
    return services.submit("--job-id", job_id, "--nproc", str(nproc), "--args", args, "--", *behave(*program))


def _finish(services, proc, timeout=180):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, services.logs() + "\n--- submit\n" + out[-3000:] + err[-3000:]
    return out


def _done(services, job_id):
    return [r for r in services.history(job_id) if r["result"] == "done"]


def _envs(text: str) -> list[dict]:
    return [json.loads(line.split("] env ", 1)[1]) for line in text.splitlines() if "] env {" in line]


def _node_running(services, job_id, instance, round_):
    for node in services.node_names:
        if any((services.tmp / f"logs-{node}" / job_id / instance).glob(f"r{round_}-*.log")):
            return node
    return None


def test_a_sync_job_across_nodes_survives_a_crash_a_hang_and_an_isolated_node(services, job_id, bootstrap):
    proc = _submit(services, job_id, "--enable-job-restart=True --max-num-of-job-restart=5 "
                   "--enable-job-hang-detection=True --job-hang-interval=3 --enable-c4d-hang-detection=True",
                   "--env", "--steps", "40", "--step-s", "0.2", "--fail-rank", "1", "--fail-rounds", "0",
                   "--fail-at-step", "3", "--fail-message", NCCL, "--hang-rank", "all", "--hang-rounds", "1",
                   "--hang-at-step", "3")
    wait_for(lambda: _node_running(services, job_id, "worker-0", 2), 90, "round 2 of worker-0")
    node = _node_running(services, job_id, "worker-0", 2)
    # C4D on that node says, in its own log (the agent's diagnostic channel), that worker-0 hangs in communication.
    with open(services.tmp / f"c4d-{node}.log", "a") as c4d:
        c4d.write(f"[C4D] level=Error kind=RankCommHang rank=0 node={node} detail=\"allreduce stuck for 190 s\"\n")
    out = _finish(services, proc)
    done = _done(services, job_id)
    pairs = [(r["action"], r["error_source"]) for r in done]
    assert pairs[:2] == [("restart_job", "instance_exit"), ("restart_job", "hang")], pairs
    # Both come from the same C4D finding, at the same time.
    assert sorted(pairs[2:]) == [("isolate_node", "c4d"), ("restart_job", "c4d")], pairs
    round3 = [e for e in _envs(out) if e["TRAINWARDEN_RESTART_ROUND"] == "3"]
    assert len(round3) == 2 and all(e["TRAINWARDEN_NODE"] != node for e in round3), round3
    # The hang's restart came with a stack report, built from the agents' dumps.
    stacks = subprocess.run([*TRAINWARDEN, "stacks", "--job", job_id, "--json", "--store", str(services.store)],
                            env=services.env, capture_output=True, text=True, timeout=60)
    [report] = json.loads(stacks.stdout)
    if find_tool("py-spy") or find_tool("pystack"):
        assert report["round"] == 1 and report["processes"] == 2 and report["report"]["missing"] == [], (
            json.dumps(report, indent=1)[:6000] + services.logs())
    else:  # the report still comes, saying what is missing
        assert report["round"] == 1 and report["processes"] == 0 and report["report"]["missing"], report
    listed = subprocess.run([*TRAINWARDEN, "nodes", "--json"], env=services.env, capture_output=True, text=True,
                            timeout=60)
    assert {n["node"]: n["state"] for n in json.loads(listed.stdout)}[node] == "isolated"


@pytest.mark.parametrize("victim", ["processor", "actuator"])
def test_a_killed_service_is_replaced_and_every_fault_is_recorded_exactly_once(services, job_id, victim):
    proc = _submit(services, job_id, "--enable-job-restart=True",
                   "--steps", "60", "--step-s", "0.1", "--fail-rank", "1", "--fail-rounds", "0,1",
                   "--fail-at-step", "5", "--fail-message", NCCL)
    wait_for(lambda: _node_running(services, job_id, "worker-1", 1), 60, "round 1")
    services.kill(victim)
    time.sleep(1.0)
    services.start(victim)
    out = _finish(services, proc)
    done = _done(services, job_id)
    assert [(r["action"], r["round"]) for r in done if r["action"] == "restart_job"] == [
        ("restart_job", 0), ("restart_job", 1)], done
    # The same NCCL error twice on one node may also isolate that node (once): the node rule of
    # engine/operational.py, when the placement spread the job over nodes.
    assert [r["action"] for r in done if r["action"] != "restart_job"] in ([], ["isolate_node"]), done
    assert out.count("hello worker-0") == 3  # rounds 0, 1, 2: no double restart


def test_a_lost_node_makes_the_job_restart_on_the_others(services, job_id):
    proc = _submit(services, job_id, "--enable-job-restart=True", "--steps", "80", "--step-s", "0.1")
    wait_for(lambda: _node_running(services, job_id, "worker-0", 0), 60, "round 0")
    node = _node_running(services, job_id, "worker-0", 0)
    services.kill(f"agent-{node}")
    _finish(services, proc)
    [lost] = _done(services, job_id)
    assert (lost["action"], lost["error_source"]) == ("restart_job", "node_lost") and lost["node_name"] == node
    assert _node_running(services, job_id, "worker-0", 1) not in (None, node)
    assert _node_running(services, job_id, "worker-1", 1) not in (None, node)


@pytest.mark.alone
def test_the_services_reconnect_when_the_broker_restarts(services, job_id):
    from tests.cluster.processes import KAFKA_SCRIPT

    port = services.bootstrap.rsplit(":", 1)[1]
    env = dict(os.environ, KAFKA_PORT=port)
    proc = _submit(services, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                   "--job-hang-interval=20", "--steps", "150", "--step-s", "0.1", "--fail-rank", "1",
                   "--fail-rounds", "0", "--fail-at-step", "3", "--fail-message", NCCL)
    wait_for(lambda: _node_running(services, job_id, "worker-1", 1), 60, "round 1")
    subprocess.run([str(KAFKA_SCRIPT), "restart"], env=env, check=True, capture_output=True, timeout=120)
    _finish(services, proc, timeout=240)
    done = _done(services, job_id)
    assert [(r["action"], r["error_source"]) for r in done] == [("restart_job", "instance_exit")]
    assert all(services.alive().values()), services.alive()


def test_malformed_messages_and_huge_lines_are_dead_lettered_or_cut_and_nothing_crashes(services, job_id,
                                                                                         bootstrap):
    producer = open_bus(bootstrap).producer()
    for kind in ("events", "logs", "decisions", "commands"):
        producer.send(services.topic(kind), job_id, b"{this is not json")
        producer.send(services.topic(kind), job_id, b'{"v":1,"type":"no_such_type"}')
    producer.send(services.topic("events"), job_id, b"\xff\xfe\x00 not utf-8")
    producer.send(services.topic("logs"), job_id,
                  b'{"v":1,"type":"log_line","text":"' + b"x" * (9 * 1024 * 1024) + b'"}')
    producer.flush(30)
    code = ("import sys; sys.stdout.write('y' * (10 * 1024 * 1024) + '\\n'); "
            "sys.stdout.buffer.write(b'bad \\xff\\xfe utf8\\n'); sys.stdout.flush()")
    proc = services.submit("--job-id", job_id, "--", "python3", "-c", code)
    out = _finish(services, proc)
    assert "…[line truncated]" in out and "bad \ufffd\ufffd utf8" in out
    assert max(len(line) for line in out.splitlines()) < 20_000
    consumer = open_bus(bootstrap).consumer([services.topic("deadletter")], None, from_beginning=True)
    letters = []
    # Until every expected letter is in (the loop ends as soon as they are); a
    # loaded 2-core machine takes longer than 20 s for the last of them.
    deadline = time.time() + 90
    while time.time() < deadline:
        letters += [json.loads(r.value) for r in consumer.poll(1.0) if job_id.encode() in r.value]
        if sum(1 for letter in letters if letter["service"] == "processor") >= 5 and \
                sum(1 for letter in letters if letter["service"] == "actuator") >= 2:
            break
    consumer.close()
    by_service = {}
    for letter in letters:
        by_service.setdefault(letter["service"], 0)
        by_service[letter["service"]] += 1
    assert by_service.get("processor", 0) >= 5 and by_service.get("actuator", 0) >= 2, by_service
    assert any("bytes; the most is" in letter["error"] for letter in letters)
    assert all(services.alive().values()), services.alive()
