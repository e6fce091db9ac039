"""The runtime registry and the protocol: every runtime kind is one entry
(name, capabilities, options, how it is built), the acting half calls a
runtime only through ``JobRuntime``, and a runtime says what it sees as
typed events, never by calling into the service."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from tests.scenarios.pinned import KIND as PINNED
from trainwarden.bus import COMMANDS, DECISIONS, EVENTS, topic_specs
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.messages import StartInstance
from trainwarden.bus.serde import decode, encode
from trainwarden.cli.main import build_parser
from trainwarden.cli.main import main as cli_main
from trainwarden.events import (Decision, DecisionKind, InstanceExited, InstanceSpec, JobSpec, NodeLost, Preempted,
                                Reason, RoleSpec)
from trainwarden.jobspec import JobDefinition
from trainwarden.runtime import registry
from trainwarden.runtime.agents import UnplacedRuntime
from trainwarden.runtime.base import (AgentCommand, CapacityTaken, Capability, EngineError, JobEvent, JobRuntime,
                                      NodeDown, RuntimeEvent)
from trainwarden.runtime.registry import RuntimeKind
from trainwarden.services.actuator_service import ActuatorService
from trainwarden.store import SpoolWriter

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline" / "trainwarden"
# Diagnosis reads job logs wherever they were printed: a slurmstepd line marks a
# scheduler's step, not a training step, in a job that ran under srun on any runtime.
# That is log text the evidence recognises, not a runtime the code depends on.
LOG_TEXT = {"evidence/phase.py"}
T0 = 1_800_000_000.0


def test_slurm_is_named_in_no_module_outside_its_package_and_its_registry_entry():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("runtime/slurm/") or where in LOG_TEXT:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search("slurm", line, re.IGNORECASE):
                entry = where == "runtime/registry.py" and "import KIND as" in line
                if not entry:
                    found.append(f"{where}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)


def _protocol_calls() -> set[str]:
    return {name for name, _ in inspect.getmembers(JobRuntime) if not name.startswith("_")} | set(
        JobRuntime.__annotations__)


@pytest.mark.parametrize("kind", [*registry.submitted(), PINNED], ids=lambda k: k.name)
def test_every_runtime_the_actuator_builds_has_every_call_of_the_protocol_and_the_methods_of_its_capabilities(kind):
    module, _, name = kind.runtime.partition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    missing = [call for call in _protocol_calls() if call != "instance_names" and not hasattr(cls, call)]
    assert missing == [], f"{kind.name}: {missing}"
    assert hasattr(cls, "isolate_node") == (Capability.ISOLATE_NODE in kind.capabilities)
    assert hasattr(cls, "preempt") == (Capability.PREEMPT in kind.capabilities)


def test_the_acting_half_never_asks_a_runtime_what_it_has_and_calls_only_the_protocol():
    calls = _protocol_calls() | {"isolate_node", "preempt"}
    for where in ("supervision/acting.py", "services/actuator_service.py", "actuator.py"):
        text = (PACKAGE / where).read_text()
        assert "hasattr(" not in text, where
        used = set(re.findall(r"(?<!trainwarden\.)\bruntime\.(\w+)", text))
        assert used <= calls, f"{where} calls {sorted(used - calls)} outside JobRuntime"


def test_a_second_kind_under_a_registered_name_is_refused_and_an_unknown_name_says_what_there_is():
    with pytest.raises(ValueError, match="registered already"):
        registry.register(dataclasses.replace(PINNED, name="agents"))
    with pytest.raises(registry.UnknownRuntime, match="the runtimes are local, agents, "):
        registry.runtime_kind("nowhere")


def test_a_job_submitted_without_a_runtime_goes_to_the_registrys_fallback():
    assert JobSpec(roles=()).runtime == JobDefinition.runtime == registry.FALLBACK.name
    assert registry.FALLBACK.submitted and registry.FALLBACK.site is not None


# ------------------------------------------------ a kind registered alone

class _Seen:
    """A runtime that only reports: what an engine would tell it."""

    capabilities = frozenset({Capability.RESTART_JOB})

    def __init__(self, job, cluster, clock):
        self.instance_names = [i.name for i in job.instances]
        self.job = job
        self.said: list[RuntimeEvent] = []
        self.finished = False

    def start(self, name, round_, start):
        self.said.append(AgentCommand(StartInstance(
            node="far-1", job_id=self.job.job_id, action_id=f"{name}/{round_}/{start}",
            instance=next(i for i in self.job.instances if i.name == name), round=round_, start=start,
            world_size=1, master_addr="127.0.0.1", master_port=1, command=("true",), env=(), workdir="",
            max_restarts=0)))

    def stop(self, names, snapshot="", incarnations=None):
        pass

    def stop_all(self, snapshot=""):
        pass

    def restore(self, incarnations):
        pass

    def heard(self, instance, round_, start, node):
        return True

    def poll(self):
        self.said += [NodeDown("far-1", ("worker-0",)), CapacityTaken(0, "taken back"), EngineError("far is down"),
                      JobEvent(InstanceExited(job_id="j", time=T0, instance="worker-0", round=0, start=0,
                                              exit_code=137))]
        return self.drain()

    def drain(self):
        said, self.said = self.said, []
        return said

    def finish(self):
        self.finished = True


class _FarSite:
    built: list = []

    def runtime(self, job, cluster, clock):
        self.built.append(_Seen(job, cluster, clock))
        return self.built[-1]

    def node_state(self, node, isolated, reason):
        return [EngineError(f"could not drain {node}")]

    def describe(self):
        return "far jobs"


FAR = RuntimeKind("far", "a test's engine", "trainwarden submit --runtime far", f"{__name__}:_Seen",
                  site=lambda options, run_as: _FarSite() if options.get("far_dir") else None)


@pytest.fixture
def far():
    registry.register(FAR)
    yield FAR
    registry.unregister(FAR.name)


def test_a_registered_kind_is_offered_to_submit_and_listed_by_trainwarden_runtimes(far, capsys):
    assert cli_main(["runtimes", "-o", "name"]) == 0
    assert capsys.readouterr().out.split() == ["local", "agents", "slurm", "kubernetes", "far"]
    parser = build_parser()
    assert parser.parse_args(["submit", "--runtime", "far", "--", "true"]).runtime == "far"
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "--runtime", "local", "--", "true"])  # run's alone, never submitted
    assert "'local' is not one of agents, slurm, kubernetes, far" in capsys.readouterr().err


def test_a_kinds_options_reach_the_actuator_and_agent_commands_with_their_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/x.conf")
    parser = build_parser()
    actuator = parser.parse_args(["actuator", "--slurm-dir", "/shared/tw"])
    assert (actuator.slurm_dir, actuator.slurm_conf) == ("/shared/tw", "/etc/slurm/x.conf")
    agent = parser.parse_args(["agent", "--node", "n1", "--slurm-dir", str(tmp_path)])
    (adopter,) = registry.agent_setup(vars(agent))["adopters"]  # the node's Slurm tasks, adopted through its host
    tasks = adopter("127.0.0.1:1")
    assert (tasks.directory, tasks.node) == (tmp_path, "n1")
    assert registry.agent_setup(vars(parser.parse_args(["agent", "--node", "n1"]))) == {"adopters": []}
    site = registry.sites(vars(actuator))["slurm"]
    assert site.describe() == "Slurm jobs in /shared/tw" and set(registry.sites({})) == {"agents"}


def test_an_actuator_builds_a_registered_kinds_runtime_and_carries_out_what_it_says(far, tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    spec = JobSpec(roles=(RoleSpec("worker", 1, ("true",)),), runtime="far")
    start = Decision(kind=DecisionKind.START_JOB, reason=Reason.JOB_SUBMITTED, rule="submit", job_id="j", time=T0,
                     round=0, action_id="start-j", starts=(("worker-0", 0),), spec=spec,
                     instances=(InstanceSpec("worker-0", "worker", 0, 0),), detected_at=T0)
    producer = bus.producer()
    producer.send(DECISIONS, "j", encode(start))
    producer.flush()
    said = []
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), clock=lambda: T0,
                              sites=registry.sites({"far_dir": "/x"}), say=lambda text, job_id: said.append(text))
    events = bus.consumer([EVENTS], None, from_beginning=True)
    commands = bus.consumer([COMMANDS], None, from_beginning=True)
    service.run_once(0.0)
    [runtime] = _FarSite.built
    assert runtime.job.job_id == "j"
    [command] = [decode(COMMANDS, r.value) for r in commands.poll(0.0, max_records=10)]
    assert isinstance(command, StartInstance) and command.node == "far-1"
    service.run_once(0.0)
    seen = [decode(EVENTS, r.value) for r in events.poll(0.0, max_records=10)]
    assert [type(e) for e in seen] == [NodeLost, Preempted, InstanceExited]
    assert (seen[0].node, seen[0].instances, seen[1].reason) == ("far-1", ("worker-0",), "taken back")
    assert service.counters.runtime_errors >= 1 and "far is down" in said


def test_a_job_asking_for_a_kind_this_actuator_does_not_reach_runs_on_the_fallback_saying_which_option_it_lacks(
        tmp_path):
    bus = MemoryBus()
    bus.create_topics(topic_specs(2))
    said = []
    service = ActuatorService(bus, SpoolWriter(tmp_path / "store"), clock=lambda: T0,
                              say=lambda text, job_id: said.append(text))
    spec = JobSpec(roles=(RoleSpec("worker", 1, ("true",)),), runtime="slurm")
    supervisor = service._job("j", spec, (InstanceSpec("worker-0", "worker", 0, 0),), "", T0)
    assert type(supervisor.runtime).__name__ == "AgentsRuntime"
    assert said == ["the job asks for the slurm runtime, but this actuator has none (--slurm-dir); "
                    "it runs on the agents"]


def test_a_decision_about_a_job_never_started_here_still_isolates_its_node_through_an_event():
    runtime = UnplacedRuntime()
    runtime.isolate_node("n1", "c4d_error")
    [event] = runtime.drain()
    assert (event.node, event.reason) == ("n1", "c4d_error") and runtime.drain() == []
