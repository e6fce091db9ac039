"""Agents, a processor and an actuator in one process, on any bus."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from trainwarden.bus import topic_specs
from trainwarden.events import Decision, LogLine
from trainwarden.rules.loader import load_rules
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.runtime import registry
from trainwarden.services.agent import Agent
from trainwarden.services.follow import Follower, submit
from trainwarden.services.loop import serve
from trainwarden.services.processor import Processor
from trainwarden.store import open_writer


class Service:
    """A service on the one service loop, in a thread; its errors surface in the test."""

    def __init__(self, name: str, service):
        self.name = name
        self.service = service
        self.stopped = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=serve, name=name, daemon=True,
                                       args=(service, self.stopped.is_set, self._say))
        self.thread.start()

    def _say(self, level: str, text: str) -> None:
        if level == "error":
            self.errors.append(text)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


class LocalCluster:
    def __init__(self, bus, tmp: Path, nodes: int = 3, slots: int = 2, node_timeout_s: float = 3.0,
                 slurm=None, sites=None, node_names=None, agent_options=None):
        """slurm: a SlurmSite; the agents are then those of the Slurm nodes n1..n3.
        sites: more runtimes the actuator reaches, by kind (runtime/registry.py);
        node_names: the agents' nodes (an engine's own node names); agent_options:
        the agents' runtime options (``trainwarden agent``'s, by dest), set up
        through the registry as the command does."""
        self.bus = bus
        self.tmp = tmp
        self.store = tmp / "store"
        bus.create_topics(topic_specs(4))
        names = list(node_names or (f"n{i + 1}" if slurm else f"node-{i}" for i in range(nodes)))
        options = {**({"slurm_dir": str(slurm.directory)} if slurm else {}), **(agent_options or {})}
        # Each node's C4D log: the trusted diagnostic channel of its agent.
        self.c4d_logs = {name: tmp / f"c4d-{name}.log" for name in names}
        for path in self.c4d_logs.values():
            path.touch()
        self.agents = {name: Service(f"agent-{name}", Agent(bus, name, slots, tmp / f"logs-{name}",
                                                            address="127.0.0.1", c4d_log=self.c4d_logs[name],
                                                            **registry.agent_setup({**options, "node": name})))
                       for name in names}
        self.processor = Service("processor", Processor(bus, load_rules()))
        self.extra: list[Service] = []  # services a test adds (a market service)
        self.actuator = Service("actuator", ActuatorService(bus, open_writer(self.store),
                                                            node_timeout_s=node_timeout_s,
                                                            sites={**({"slurm": slurm} if slurm else {}),
                                                                   **(sites or {})}))
        deadline = time.time() + 20
        while not all(a.service.ready() for a in self.agents.values()) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # a heartbeat from every agent

    def run(self, job, timeout_s: float = 60.0) -> tuple[Decision | None, list[LogLine], list[Decision]]:
        follower = Follower(self.bus, job.job_id)
        assert follower.ready()
        lines: list[LogLine] = []
        decisions: list[Decision] = []
        submit(self.bus, job)
        outcome = follower.follow(lines.append, decisions.append, timeout_s=timeout_s)
        follower.close()
        return outcome, lines, decisions

    def node_of(self, job_id: str, instance: str) -> str | None:
        """The node whose agent runs this instance now."""
        for name, agent in self.agents.items():
            if (job_id, instance) in agent.service.running:
                return name
        return None

    def errors(self) -> list:
        return [(s.name, e) for s in self.services() for e in s.errors]

    def services(self) -> list[Service]:
        return [*self.agents.values(), self.processor, self.actuator, *self.extra]

    def stop(self) -> None:
        for service in self.services():
            if not service.stopped.is_set():
                service.stop()
