"""A service's signed bus: its refusals are in its health line and its metrics,
and its start line names the signing key id (never a secret)."""

import dataclasses
import functools

from trainwarden.bus import COMMANDS, topic_specs
from trainwarden.services import loop, runner

SECRET = "c" * 16 + "3" * 16


@dataclasses.dataclass
class _Counters:
    commands: int = 0


class _Reader:
    """Reads the commands topic for two iterations, then asks the run to stop."""

    def __init__(self, bus, run):
        self.consumer = bus.consumer([COMMANDS], None, from_beginning=True)
        self.run = run
        self.counters = _Counters()
        self.calls = 0

    def run_once(self) -> None:
        self.counters.commands += len(self.consumer.poll(0.05))
        self.calls += 1
        if self.calls >= 2:
            self.run._stopping.set()

    def close(self) -> None:
        self.consumer.close()


def test_a_signed_services_refusals_are_counted_in_its_health_line_and_metrics(monkeypatch, capfd):
    from prometheus_client import generate_latest

    monkeypatch.setenv("TRAINWARDEN_SIGNING_KEY", SECRET)
    monkeypatch.delenv("TRAINWARDEN_SIGNING_KEY_FILE", raising=False)
    monkeypatch.setattr(runner, "serve", functools.partial(loop.serve, health_every_s=0.0))
    run = runner.ServiceRun("agent")
    bus = run.open_bus("memory")
    bus.create_topics(topic_specs(1))
    bus.inner.producer().send(COMMANDS, "n1", b'{"v":1,"type":"stop_instances"}')  # not signed
    bus.producer().send(COMMANDS, "n1", b'{"v":1,"type":"stop_instances","node":"n1"}')
    service = _Reader(bus, run)
    assert run.run(service, "a reader") == 0
    err = capfd.readouterr().err
    assert "messages signed with key id default (1 key id verifies)" in err and SECRET not in err
    assert "commands 1, refused_unsigned 1, refused_bad_signature 0" in err
    metrics = generate_latest(run.observer.registry).decode()
    assert 'trainwarden_bus_messages_refused_total{reason="unsigned"} 1.0' in metrics
    assert 'trainwarden_bus_messages_refused_total{reason="replayed"} 0.0' in metrics
