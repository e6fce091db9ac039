"""Spot jobs on the cluster against a real broker: the market service
(`trainwarden market`) publishes a trace's quotes, every processor reads
them, and a spot job submitted to the agents runtime queues, starts, is
released with its pool's notice, requeues and resumes from its checkpoint.
Opt in with TRAINWARDEN_KAFKA (deploy/kafka/local-kafka start)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.cluster.processes import services_on_broker, wait_for
from tests.conftest import ROOT, TRAINWARDEN
from trainwarden.bus import DECISIONS, MARKET, open_bus
from trainwarden.bus.serde import DecodeError, decode

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

TRAIN = ROOT / "examples" / "train.py"
FT_ON = "--job-execution-mode=Sync --enable-job-restart=True"
BID = 0.6  # SpotDiscountLimit 0.5 of on-demand 1.2


@pytest.fixture
def services(tmp_path):
    yield from services_on_broker(tmp_path, nodes=2, slots=2)


def write_job(tmp_path, job_id: str, args: str = FT_ON, steps: int = 40) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        job_id: {job_id}
        args: {args}
        stop_grace_s: 3
        checkpoint_dir: {tmp_path}/ckpt/{{job_id}}
        env: {{STEPS: "{steps}", STEP_S: "0.2", CHECKPOINT_EVERY: "1"}}
        roles:
          worker:
            count: 2
            command: ["{sys.executable}", "{TRAIN}"]
            spot:
              SpotStrategy: SpotWithPriceLimit
              SpotDiscountLimit: 0.5
              instance_type: ecs.g7.xlarge
        """))
    return str(path)


def write_market(tmp_path, rows, notice_s: float = 0) -> str:
    """rows: (time, price, stock); times are seconds from the market service's start."""
    lines = "\n".join(f"  - {{time: {t}, instance_type: ecs.g7.xlarge, price: {p}, stock: {s}}}" for t, p, s in rows)
    path = tmp_path / "market.yaml"
    path.write_text(f"pools:\n  general: {{notice_s: {notice_s}}}\ninstance_types:\n"
                    f"  ecs.g7.xlarge: {{pool: general, on_demand: 1.2}}\nprices:\n{lines}\n")
    return str(path)


def start_market(services, market: str):
    return services.start("market", "--market", market, "--interval", "0.2")


def spot_steps(services, job_id: str) -> list[dict]:
    out = subprocess.run([*TRAINWARDEN, "history", "--job", job_id, "--spot", "--json", "--store",
                          str(services.store)], env=services.env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def job_row(services, job_id: str) -> dict:
    out = subprocess.run([*TRAINWARDEN, "history", "--jobs", "--job", job_id, "--json", "--store",
                          str(services.store)], env=services.env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    return row


class Watch:
    """The test's own view of the market and decisions topics, timed on its
    own clock: when it first saw a quote at or below the bid, and each decision."""

    def __init__(self, services, job_id: str):
        bus = open_bus(services.bootstrap)
        self.job_id = job_id
        self.topics = {services.topic("market"): MARKET, services.topic("decisions"): DECISIONS}
        self.consumer = bus.consumer(list(self.topics), None, from_beginning=True)
        self.allowed_at: list[float] = []  # each time a quote at or below the bid was first seen after one above
        self.decisions: list[tuple[float, str]] = []
        self._below = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for record in self.consumer.poll(0.05, 500):
                seen = time.time()
                try:
                    message = decode(self.topics[record.topic], record.value)
                except DecodeError:
                    continue
                if self.topics[record.topic] == MARKET:
                    below = all(o.price <= BID and o.stock >= 2 for o in message.offers)
                    if below and not self._below:
                        self.allowed_at.append(seen)
                    self._below = below
                elif getattr(message, "job_id", "") == self.job_id and hasattr(message, "kind"):
                    self.decisions.append((seen, message.kind.value))

    def kinds(self) -> list[str]:
        return [kind for _, kind in self.decisions]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()


def test_a_spot_job_on_agents_queues_runs_is_released_with_notice_and_resumes_from_its_checkpoint(
        services, tmp_path, job_id):
    # Above the bid, then below; up again (released with 1 s notice); below
    # with too little stock (still queued); then enough stock. Running 12 s:
    # with 5 s, torch beside another test's was still importing at the
    # notice (no handler yet, so no checkpoint: round 1 resumed at step 0).
    market = write_market(tmp_path, [(0, 0.9, 8), (4, 0.3, 8), (16, 0.9, 8), (18, 0.3, 1), (20, 0.3, 8)], notice_s=1)
    start_market(services, market)
    # 20 s of steps: still training at the notice on a quiet machine.
    proc = services.submit(write_job(tmp_path, job_id, steps=100), "--runtime", "agents", "--market", market)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, (out, err, services.logs())
    steps = spot_steps(services, job_id)
    assert [s["state"] for s in steps] == ["queued", "running", "requeued", "running", "succeeded"], steps
    assert "with 1 s notice" in steps[2]["message"], steps[2]
    assert steps[-1]["preemptions"] == 1 and 0 < steps[-1]["paid"] < steps[-1]["on_demand"]
    # SIGTERM first: the worker saved its checkpoint on it; the next round resumed from it.
    assert re.search(r"SIGTERM, checkpoint saved at step \d+", out), out
    assert re.search(r"round 1: .*, resuming at step [1-9]", out), out
    # Never counted as a restart.
    row = job_row(services, job_id)
    assert row["status"] == "succeeded" and row["rounds"] == 0, row


def test_a_spot_job_with_fault_tolerance_off_fails_at_the_first_preemption(services, tmp_path, job_id):
    market = write_market(tmp_path, [(0, 0.3, 8), (4, 0.9, 8), (6, 0.3, 8)])
    start_market(services, market)
    proc = services.submit(write_job(tmp_path, job_id, args="--fault-tolerant-policy=Never"), "--runtime", "agents",
                           "--market", market)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    steps = spot_steps(services, job_id)
    assert [s["state"] for s in steps] == ["queued", "running", "failed"], steps
    assert job_row(services, job_id)["status"] == "failed"


@pytest.mark.parametrize("victim", ["market", "processor"])
def test_a_killed_market_service_or_processor_starts_nothing_above_the_bid_and_the_job_starts_within_1s_after(
        services, tmp_path, job_id, victim):
    # Above the bid long enough for the victim to be killed and come back
    # (a killed processor's partitions wait for its session to time out).
    switch = 8 if victim == "market" else 25
    market = write_market(tmp_path, [(0, 0.9, 8), (switch, 0.3, 8)])
    watch = Watch(services, job_id)
    try:
        start_market(services, market)
        proc = services.submit(write_job(tmp_path, job_id, steps=5), "--runtime", "agents", "--market", market)
        wait_for(lambda: "queue_job" in watch.kinds(), 60, "the job to be queued")
        services.kill(victim)
        if victim == "market":
            # Its last quote stops holding (3 s); nothing may start meanwhile. The
            # new service's trace starts again: above the bid for `switch` s.
            time.sleep(4)
            assert watch.kinds() == ["queue_job"]
            start_market(services, market)
        else:
            services.start("processor")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err, services.logs())
        [(started, _)] = [d for d in watch.decisions if d[1] == "start_job"]
        assert watch.allowed_at, "no quote at or below the bid was seen"
        allowed = watch.allowed_at[0]
        assert started >= allowed, "the job started before any quote allowed it"
        print(f"{victim} killed: the job started {started - allowed:.3f} s after the first quote that allowed it")
        assert started - allowed < 1.0, f"started {started - allowed:.2f} s after the first quote that allowed it"
    finally:
        watch.close()


@pytest.fixture
def signed_services(tmp_path, monkeypatch):
    """The services, the market service and this test sharing one signing key."""
    for name in ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_SIGNING_KEY_FILE", "TRAINWARDEN_TRUSTED_NETWORK"):
        monkeypatch.delenv(name, raising=False)
    keys = tmp_path / "keys"
    keys.write_text("k1 " + "1" * 40 + "\n")
    keys.chmod(0o600)
    monkeypatch.setenv("TRAINWARDEN_SIGNING_KEY_FILE", str(keys))
    yield from services_on_broker(tmp_path, nodes=2, slots=2)


def test_a_forged_quote_below_the_bid_starts_nothing_and_is_dead_lettered_on_a_signed_cluster(
        signed_services, tmp_path, job_id):
    from kafka import KafkaProducer

    from trainwarden.bus.base import read_to_end
    from trainwarden.bus.messages import MarketQuote
    from trainwarden.bus.serde import encode
    from trainwarden.events import Offer

    services = signed_services
    market = write_market(tmp_path, [(0, 0.9, 8), (10, 0.3, 8)])
    watch = Watch(services, job_id)  # signed: it never sees the forged quote
    try:
        start_market(services, market)
        proc = services.submit(write_job(tmp_path, job_id, steps=5), "--runtime", "agents", "--market", market)
        wait_for(lambda: "queue_job" in watch.kinds(), 60, "the job to be queued")
        forged = MarketQuote(market=market, epoch="forged", seq=0, time=time.time(), at=0.0, valid_s=60.0,
                             offers=(Offer(instance_type="ecs.g7.xlarge", price=0.01, stock=8, on_demand=1.2),))
        plain = KafkaProducer(bootstrap_servers=services.bootstrap)
        plain.send(services.topic("market"), key=market.encode(), value=encode(forged))
        plain.flush(30)
        plain.close()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err, services.logs())
        [(started, _)] = [d for d in watch.decisions if d[1] == "start_job"]
        assert watch.allowed_at and started >= watch.allowed_at[0], "the job started on the forged quote"
        consumer = open_bus(services.bootstrap).consumer([services.topic("deadletter")], None, from_beginning=True)
        letters = [json.loads(r.value) for r in read_to_end(consumer)]
        consumer.close()
        assert [letter for letter in letters if letter["service"] == "processor"
                and letter["error"].startswith("unsigned") and "forged" in letter["value"]], letters
    finally:
        watch.close()
