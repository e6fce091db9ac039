"""One job, run to its end on a named runtime, and what it left behind: the
outcome, the lines it printed as the user sees them (``run``'s console,
``submit --follow``), and the history's rows. The same driver for every
runtime, so a scenario is written once (tests/scenarios/test_scenarios.py).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

import pytest

from trainwarden.bus import EVENTS
from trainwarden.bus.memory import MemoryBus
from trainwarden.bus.serde import encode
from trainwarden.events import Decision, DecisionKind, LogLine, Preempted
from trainwarden.jobspec import JobDefinition, from_command
from trainwarden.rules.loader import load_rules
from trainwarden.runtime import registry
from tests.scenarios.pinned import KIND as PINNED
from trainwarden.runtime.registry import runtime_kind
from trainwarden.services.embedded import EmbeddedRun
from trainwarden.services.follow import Follower, submit
from trainwarden.services.market_service import MarketService
from trainwarden.spot.market import TraceMarket
from trainwarden.spot.spec import check_bids
from trainwarden import report
from trainwarden.store import analytics, open_reader, open_writer
from tests.e2e.test_c4d import send_c4d

# Every runtime of the registry, and the one these tests define themselves
# (tests/scenarios/pinned.py, registered while its scenarios run).
RUNTIMES = (*registry.names(), PINNED.name)
PROGRAM = str(Path(__file__).resolve().parent / "programs" / "resume.py")

# When a printed line matches, C4D's collector on the node running that
# instance sends this finding through the trusted channel (the C4D socket of
# `run`; the agents' C4D logs, which only this test process writes); or the
# job's runtime reports what it saw (a Preempted event: the scheduler took the
# round's capacity back), as a runtime does: into the run's inbox, or onto the
# bus's events topic as the actuator's runtime sends it. On kubernetes the
# preemption is real: the instance's pod is evicted through the Eviction API.
Trigger = Callable[[LogLine], "Optional[str | Preempted]"]


@dataclasses.dataclass
class Outcome:
    runtime: str
    final: Optional[Decision]
    lines: list[LogLine]
    faults: list[dict]  # the newest version of every fault record, in time order
    stacks: list[dict]
    diagnoses: list[dict]
    jobs: list[dict]
    dead_letters: list[dict]
    log_files: list[Path]  # the per-instance files the runtime keeps (none for local)
    # What the engine itself shows after the job, where a runtime looks (kubernetes: the
    # incarnations each pod ran, the nodes it isolated, those an operator's uncordon returned).
    engine: dict = dataclasses.field(default_factory=dict)
    spot: list[dict] = dataclasses.field(default_factory=list)  # the spot_transitions rows, in time order
    spot_costs: list[dict] = dataclasses.field(default_factory=list)  # the spot_costs query's rows for the job
    reported_spot: list[dict] = dataclasses.field(default_factory=list)  # what `trainwarden report` read of them

    @property
    def succeeded(self) -> bool:
        return self.final is not None and self.final.kind is DecisionKind.COMPLETE_JOB

    def texts(self, instance: str | None = None, round_: int | None = None) -> list[str]:
        return [line.text for line in self.lines
                if (instance is None or line.instance == instance) and (round_ is None or line.round == round_)]

    def rows(self) -> list[tuple]:
        """The history's rows as a runtime-independent shape (node names
        aside): the fault rows, and the job's row (its ``rounds`` means the
        same everywhere: supervision/acting.py)."""
        return sorted((r["round"], r["action"], r["error_source"], r["result"], r["reason"], r["instance_name"],
                       r["category"], r["verdict"]) for r in self.faults) + [
            ("job", r["status"], r["reason"], r["instances"], r["rounds"]) for r in self.jobs]


def job(job_id: str, tmp: Path, args: str, *program: str, nproc: int = 2, python: str = sys.executable) -> JobDefinition:
    definition = from_command([python, PROGRAM, *program], nproc, args, job_id, stop_grace_s=2)
    return dataclasses.replace(definition, checkpoint_dir=str(tmp / "checkpoints"))


def run(runtime: str, tmp: Path, definition: JobDefinition, trigger: Optional[Trigger] = None,
        timeout_s: float = 90.0, slurm=None, market: Optional[str] = None) -> Outcome:
    """slurm: the site for the slurm runtime (default: slurm_site(tmp)); market:
    a trace file for a spot job (``run --market``; on a cluster, its market
    service, started as the job is submitted: the trace's time 0 is then)."""
    kind = runtime_kind(runtime)  # a runtime the registry does not know is a mistake in the test
    if not kind.submitted:
        return _run_local(tmp, definition, trigger, timeout_s, market)
    definition = dataclasses.replace(definition, runtime=kind.name)
    if market is not None:
        if runtime not in ("agents", "slurm", "kubernetes"):
            pytest.skip(f"spot jobs are not wired to the {runtime} runtime yet (issue 25): submit refuses them")
        if runtime != "kubernetes":  # the kubernetes site is built below, for every job
            slurm = (slurm or slurm_site(tmp)) if runtime == "slurm" else None  # the Slurm nodes' agents, as below
            return _run_agents(tmp, definition, trigger, timeout_s, market=market, slurm=slurm)
    if runtime == "slurm":  # its agents are those of the Slurm nodes, its site the cluster CI starts
        return _run_agents(tmp, definition, trigger, timeout_s, slurm=slurm or slurm_site(tmp))
    if runtime == "kubernetes":  # its agents are those of the Kubernetes nodes CI starts, adopting the pods
        with kube_site(tmp) as (site, agent_options, section):
            definition = dataclasses.replace(definition, runtime_options=json.dumps({"kubernetes": section}))
            trigger = _evicting(trigger, site, section["namespace"]) if trigger else None
            looked: dict = {}
            outcome = _run_agents(tmp, definition, trigger, timeout_s, sites={"kubernetes": site}, market=market,
                                  node_names=KUBE_NODES, agent_options=agent_options, after=lambda bus: looked.update(
                                      _kube_after(site, agent_options["k8s_state_dir"], bus)))
            return dataclasses.replace(outcome, engine=looked)
    # Any other kind: the site its entry builds without options.
    site = kind.site({}, None)
    if site is None:  # else its jobs would run on the fallback, and prove nothing of it
        pytest.skip(f"the {kind.name} runtime needs its actuator options ({', '.join(kind.flags('actuator'))}); "
                    f"these tests do not set it up yet")
    return _run_agents(tmp, definition, trigger, timeout_s, sites={kind.name: site})


def slurm_site(tmp: Path, run_as=None, python: str = sys.executable):
    """The local Slurm cluster CI starts (deploy/slurm/local-slurm), or a skip saying how to get one.
    run_as: the jobs' user (SlurmCli's); python: the task wrappers' interpreter."""
    if os.environ.get("TRAINWARDEN_SLURM") != "1" or not os.environ.get("SLURM_CONF"):
        pytest.skip("no Slurm cluster: start one with deploy/slurm/local-slurm start, export the SLURM_CONF it "
                    "prints and TRAINWARDEN_SLURM=1 (.ci/run does)")
    from trainwarden.runtime.slurm.cli import SlurmCli
    from trainwarden.runtime.slurm.runtime import SlurmSite

    return SlurmSite(SlurmCli(os.environ["SLURM_CONF"], run_as=run_as), tmp / "slurm", python=python)


KUBE_NODES = ("tw-k8s-1", "tw-k8s-2")  # deploy/k8s/local-k8s's kubelets
KUBE_IMAGE = "trainwarden.local/workload:1"
_ROOT = Path(__file__).resolve().parents[2]
_kube_namespaces: dict[str, str] = {}  # kubeconfig -> this session's namespace there


@contextlib.contextmanager
def kube_site(tmp: Path):
    """The local Kubernetes cluster CI starts (deploy/k8s/local-k8s), or a skip
    saying how to get one: the actuator's site (its starts go to the node
    agents, which hand them to the pods' hosts), the agents' options, and
    the job file's ``kubernetes:`` section. The nodes are uncordoned after."""
    if os.environ.get("TRAINWARDEN_K8S") != "1" or not os.environ.get("KUBECONFIG"):
        pytest.skip("no Kubernetes cluster: eval \"$(deploy/k8s/local-k8s start)\" and export TRAINWARDEN_K8S=1 "
                    "(.ci/run does)")
    from trainwarden.runtime.kubernetes.api import KubeApi
    from trainwarden.runtime.kubernetes.drivers import AgentPodDriver
    from trainwarden.runtime.kubernetes.runtime import KubeSite, uncordon
    from trainwarden.runtime.kubernetes.section import HostPath, KubernetesSection

    api = KubeApi.connect(os.environ["KUBECONFIG"])
    # Short paths (/tmp): the pod hosts' and agents' sockets are in them.
    state, agents = (Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) for prefix in ("twk-", "twa-"))
    # The interpreter, the program, and the checkpoints (writable).
    paths = (HostPath("/usr"), HostPath(sys.base_prefix), HostPath(str(_ROOT)), HostPath(str(tmp), writable=True))
    section = KubernetesSection(image=KUBE_IMAGE, namespace=_kube_namespace(api), image_pull_policy="Never",
                                host_paths=paths)
    site = KubeSite(api=api, driver=AgentPodDriver(), python=sys.executable, state_dir=str(state),
                    rendezvous_by_name=True, agent_dir=str(agents))
    try:
        yield site, {"k8s_state_dir": str(state), "k8s_agent_dir": str(agents)}, section.to_wire()
    finally:
        site.close()
        for node in KUBE_NODES:
            uncordon(api, node)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(agents, ignore_errors=True)


def _evicting(trigger: Trigger, site, namespace: str) -> Trigger:
    """On kubernetes a preemption is Kubernetes' own: the pod of the line's
    instance is evicted through the Eviction API (as ``kubectl drain`` does)
    and the runtime has to see it (a pod condition DisruptionTarget)."""
    from trainwarden.runtime.kubernetes.manifests import INSTANCE_ANNOTATION, job_selector

    def evict(line: LogLine):
        said = trigger(line)
        if not isinstance(said, Preempted):
            return said
        [pod] = [p["metadata"]["name"] for p in site.api.pods(namespace, job_selector(line.job_id))
                 if p["metadata"]["annotations"].get(INSTANCE_ANNOTATION) == line.instance
                 and not p["metadata"].get("deletionTimestamp")]
        site.api.evict(pod, namespace)
        return None
    return evict


def _kube_after(site, state_dir: str, bus) -> dict:
    """The incarnations each pod's host ran, the nodes isolated, and those
    returned by an operator's ``trainwarden nodes uncordon`` (sent as the
    command sends it, carried out by the actuator)."""
    from trainwarden.bus import ACTUATOR_STATE
    from trainwarden.bus.messages import NodeState
    from trainwarden.clock import now as clock_now
    from trainwarden.runtime.kubernetes.section import ISOLATED_TAINT

    def tainted() -> list[str]:
        return sorted(node for node in KUBE_NODES if any(
            t.get("key") == ISOLATED_TAINT for t in (site.api.node(node) or {}).get("spec", {}).get("taints") or ()))

    pods = {d.name: sorted(p.name.removesuffix(".out") for p in d.glob("r*s*.out"))
            for d in Path(state_dir).iterdir() if d.is_dir()}
    isolated = tainted()
    producer = bus.producer()
    for node in isolated:
        producer.send(ACTUATOR_STATE, f"node:{node}", encode(NodeState(
            node=node, state="ready", time=clock_now(), reason="uncordon by an operator")))
    producer.flush()
    deadline = time.monotonic() + 20
    while tainted() and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"pods": pods, "isolated": isolated, "uncordoned": sorted(set(isolated) - set(tainted()))}


def _kube_namespace(api) -> str:
    """One namespace for this test session's jobs, deleted when it ends."""
    kubeconfig = os.environ["KUBECONFIG"]
    if kubeconfig not in _kube_namespaces:
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace, ServiceAccount

        name = f"twtest-scenarios-{uuid.uuid4().hex[:6]}"
        api.client.create(Namespace(metadata=ObjectMeta(name=name)))
        atexit.register(lambda: api.client.delete(Namespace, name))
        deadline = time.monotonic() + 60
        while not any(True for _ in api.client.list(ServiceAccount, namespace=name)):  # pods need its default one
            assert time.monotonic() < deadline, f"namespace {name} got no default ServiceAccount in 60 s"
            time.sleep(0.2)
        _kube_namespaces[kubeconfig] = name
    return _kube_namespaces[kubeconfig]


def cancel_slurm_jobs(job_id: str) -> None:
    """Whatever a test left allocated or drained (the next test needs every node)."""
    subprocess.run(["scancel", "--quiet", f"--name=tw-{job_id}"], env=dict(os.environ), check=False,
                   capture_output=True)
    from trainwarden.runtime.slurm.cli import SlurmCli

    cli = SlurmCli(os.environ["SLURM_CONF"])
    for node in cli.nodes():
        if node.reason.startswith("Trainwarden"):
            cli.resume(node.name)


def _run_local(tmp: Path, definition: JobDefinition, trigger: Optional[Trigger], timeout_s: float,
               market: Optional[str] = None) -> Outcome:
    store = tmp / "store"
    c4d_socket = tmp / "c4d.sock"
    lines: list[LogLine] = []
    decisions: list[Decision] = []

    class Reporter:
        def line(self, event: LogLine) -> None:
            lines.append(event)
            said = trigger(event) if trigger else None
            if isinstance(said, Preempted):
                embedded.inbox.put(said)
            elif said:
                send_c4d(c4d_socket, [said])  # from this process: not one of the job's

        def flush(self) -> None:
            pass

        def decision(self, decision: Decision) -> None:
            decisions.append(decision)

        def info(self, text: str) -> None:
            pass

    provider = TraceMarket.load(market) if market else None
    embedded = EmbeddedRun(definition, load_rules(), open_writer(store), Reporter(), node="local-node",
                           c4d_socket=str(c4d_socket), market=provider,
                           spot=check_bids(definition.spot, provider) if provider else ())
    thread = threading.Thread(target=embedded.run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the job did not end in {timeout_s} s: {[d.kind for d in decisions]}"
    final = next((d for d in reversed(decisions) if d.kind in (DecisionKind.COMPLETE_JOB, DecisionKind.FAIL_JOB)),
                 None)
    return _history("local", store, definition.job_id, final, lines, [])


def _run_agents(tmp: Path, definition: JobDefinition, trigger: Optional[Trigger], timeout_s: float,
                slurm=None, sites=None, node_names=None, agent_options=None, after=None,
                market: Optional[str] = None) -> Outcome:
    """after(bus): looks at the engine once the job ended, the services still up."""
    from tests.cluster.harness import LocalCluster, Service

    bus = MemoryBus()
    cluster = LocalCluster(bus, tmp, slurm=slurm, sites=sites, node_names=node_names, agent_options=agent_options)
    lines: list[LogLine] = []
    try:
        follower = Follower(bus, definition.job_id)
        assert follower.ready()

        reports = bus.producer()

        def on_line(event: LogLine) -> None:
            lines.append(event)
            said = trigger(event) if trigger else None
            if isinstance(said, Preempted):
                reports.send(EVENTS, said.job_id, encode(said))
                reports.flush()
                return
            node = cluster.node_of(event.job_id, event.instance) if said else None
            if node:
                with open(cluster.c4d_logs[node], "a") as channel:
                    channel.write(said + "\n")

        provider = TraceMarket.load(market) if market else None
        if provider is not None:  # the market service, its trace starting now, as the job is submitted
            cluster.extra.append(Service("market", MarketService(bus, provider, interval_s=0.2)))
        submit(bus, definition, check_bids(definition.spot, provider) if provider else ())
        final = follower.follow(on_line, lambda d: None, timeout_s=timeout_s)
        # What the instances printed after the decisions (the last lines of a stop) still arrives.
        follower.follow(on_line, lambda d: None, timeout_s=1.0)
        follower.close()
        if after is not None:
            after(bus)
    finally:
        cluster.stop()
        if slurm is not None:
            cancel_slurm_jobs(definition.job_id)
    assert cluster.errors() == []
    files = sorted(p for p in tmp.glob("logs-*/**/*.log") if p.is_file())
    return _history(definition.runtime, cluster.store, definition.job_id, final, lines, files)


def _history(runtime: str, store: Path, job_id: str, final, lines, files) -> Outcome:
    where = {"job_id": job_id}
    with open_reader(store) as reader:
        faults = sorted(reader.faults(job_id), key=lambda r: (r["time"], r["action"]))
        stacks = reader.select("SELECT * FROM stack_reports FINAL WHERE job_id = {job_id:String} ORDER BY time",
                               where)
        diagnoses = reader.select("SELECT * FROM diagnoses FINAL WHERE job_id = {job_id:String} ORDER BY time",
                                  where)
        jobs = reader.jobs(job_id)
        letters = reader.dead_letters(limit=1000)
        spot = sorted(reader.spot_transitions(job_id=job_id), key=lambda r: r["time"])
        # The figures `history --costs`, the report and the dashboards show (one query, store/analytics.py).
        costs = analytics.run(reader, "spot_costs", job=job_id) if spot else []
        reported = report.collect(reader, job_id).spot if spot else []
    return Outcome(runtime, final, lines, faults, stacks, diagnoses, jobs, letters, files, spot=spot,
                   spot_costs=costs, reported_spot=reported)
