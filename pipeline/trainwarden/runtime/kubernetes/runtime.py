"""The ``kubernetes`` runtime: one job's instances as pods, one per instance,
restarted in place.

- The first start of an instance creates its pod (manifests.pod_manifest):
  its container runs the pod host (pod_host.py), which waits. Once the pod
  runs, each incarnation is handed to that pod host (through the node's
  agent, node_side.PodHosts) with the environment every runtime builds
  (environment.instance_env: the round's port, the token, the rank-0 pod's
  address). A job restart is the next incarnation in the same pods: no pod
  is deleted or rescheduled while it and its node are healthy.
- Only what must move is recreated: a pod on a node Trainwarden isolated,
  a node that is lost, a pod Kubernetes took away (DisruptionTarget) or
  whose container ended. Its replacement (the next generation of the
  instance's pod) keeps off those nodes (node affinity) and off every node
  carrying the isolation taint.
- Isolating a node cordons it, taints it ``trainwarden.io/isolated``
  (NoSchedule), labels it and writes the reason in an annotation
  (manifests.isolate_patch); ``uncordon`` removes exactly those.
- What Kubernetes reports comes from the site's watches (watch.py, shared
  by every job; a list of its own while they are out of sync) and is
  translated (observe.py) into the typed
  events every runtime says (runtime/base.py), handed back from ``poll``:
  node loss (``NodeDown``), preemption (``CapacityTaken``, not a fault), a
  pod whose container ended (its exit, a ``JobEvent``); an API error is an
  ``EngineError``, an isolation a ``NodeIsolated``.
- A spot job's release (``preempt``: the market took the capacity back)
  is a cloud's spot reclaim: SIGTERM to each incarnation in place, through
  its pod's host, with the pool's notice before SIGKILL; once the notice is
  over each pod gets a ``DisruptionTarget`` condition (reason
  ``TerminationByTrainwarden``, its status patched) and is deleted. Those
  pods are no longer the job's: nothing they say reaches the engine. The
  resumed round gets new pods, on the pool's nodes (a spot role's pods
  select its pool's label and tolerate its taint: manifests.pool_placement).
- The job's end deletes every pod of it (by its label): none is left.
- Before the first pod, the namespace and every verb the runtime uses are
  checked (KubeApi.preflight): a job the cluster cannot run fails at once,
  in one sentence, with nothing created. A transient API error is retried
  (api.py) and, if it lasts, tried again on the next turn, counted.
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
from typing import Callable, Optional, Sequence

from trainwarden.bus.messages import StartInstance
from trainwarden.events import InstanceExited, LogLine, NodeLost, Preempted, Stream
from trainwarden.runtime.agents import ClusterJob
from trainwarden.runtime.base import (Capability, CapacityTaken, EngineError, JobEvent, JobToRun, NodeDown,
                                      NodeIsolated, RuntimeEvent)
from trainwarden.runtime.environment import instance_env, job_env
from trainwarden.runtime.kubernetes.api import KubeApi, KubeError
from trainwarden.runtime.kubernetes.drivers import PodDriver, PodRun
from trainwarden.runtime.kubernetes.manifests import (
    JOB_LABEL,
    isolate_patch,
    job_selector,
    label_value,
    pod_manifest,
    release_condition,
    uncordon_patch,
    with_isolation_taint,
)
from trainwarden.runtime.kubernetes.node_side import POD_UID_VARIABLE, PodHostError
from trainwarden.runtime.kubernetes.observe import CANNOT_START, Incarnation, node_view, pod_view, translate
from trainwarden.runtime.kubernetes.section import ISOLATED_TAINT, HostPath, KubernetesSection, section_of
from trainwarden.runtime.kubernetes.sweep import Sweeper
from trainwarden.runtime.kubernetes.watch import Collection
from trainwarden.runtime.nodes import Cluster, master_port

LOOK_EVERY_S = 0.2  # at the watch's copy (memory)
LIST_EVERY_S = 1.0  # at the apiserver, while the watch is out of sync (or off)
POD_HOST_MODULE = "trainwarden.runtime.kubernetes.pod_host"
# A released pod's deletion grace: its incarnation had the pool's notice already; its host
# ends at once, and the pod shows as terminating with its DisruptionTarget, as a reclaimed one does.
RELEASE_GRACE_S = 1


@dataclasses.dataclass
class KubeSite:
    """Where this actuator reaches Kubernetes. ``python``: the interpreter
    that runs the pod host in the job's image; ``state_dir``: the nodes'
    directory the pod hosts and agents share (a hostPath)."""

    api: KubeApi
    driver: PodDriver
    python: str = "python3"
    state_dir: str = "/var/lib/trainwarden/pods"
    host_network: bool = True
    # MASTER_ADDR is the rank-0 pod's node's name rather than its InternalIP
    # (a cluster whose node names resolve where the addresses do not route, as the local one's).
    rendezvous_by_name: bool = False
    # The node agents' SDK endpoint directory (node_side.PodHosts' control_address is in it):
    # mounted read-only at the same path in every pod, so the job's SDK calls reach its node's agent.
    agent_dir: str = ""
    # Watch the jobs' pods and the nodes (watch.py), one thread each for every job of this site;
    # off, or while a watch is out of sync, each job lists them itself every LIST_EVERY_S.
    watching: bool = True
    # What the driver followed (a LocalPodDriver's pod hosts, every job's), kept by job until its runtime polls.
    _followed: dict = dataclasses.field(default_factory=dict)
    _collections: dict = dataclasses.field(default_factory=dict)
    _sweeper: Optional[Sweeper] = None

    def runtime(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float]) -> "KubernetesRuntime":
        return KubernetesRuntime(job, cluster, clock, self)

    def node_state(self, node: str, isolated: bool, reason: str) -> list[RuntimeEvent]:
        """A node isolated or uncordoned by a rule or an operator (``trainwarden
        nodes isolate|uncordon``): done in Kubernetes too. Uncordoning undoes
        only an isolation by Trainwarden (its taint); a refusal is said."""
        try:
            if isolated:
                isolate(self.api, node, reason)
            else:
                uncordon(self.api, node)
        except KubeError as exc:
            return [EngineError(str(exc) + (f" (hint: {exc.hint})" if exc.hint else ""))]
        return []

    def followed(self, job_id: str) -> list:
        """The events of this job's incarnations the driver followed since last asked."""
        for event in self.driver.poll():
            self._followed.setdefault(event.job_id, []).append(event)
        return self._followed.pop(job_id, [])

    def job_pods(self, namespace: str, job_id: str) -> tuple[list[dict], bool]:
        """The job's pods, and whether they come from the watch (then with the
        last state of those deleted in the last minute) rather than a list.
        KubeError when a list fails."""
        watched = self._collection("pods", namespace)
        found = watched.snapshot(label_value(job_id)) if watched is not None else None
        if found is not None:
            return found, True
        return self.api.pods(namespace, job_selector(job_id)), False

    def nodes(self) -> list[dict]:
        watched = self._collection("nodes", "")
        found = watched.snapshot() if watched is not None else None
        return found if found is not None else self.api.nodes()

    def sweep_later(self, namespace: str, job_id: str, grace_s: int) -> None:
        """A job ended whose pods could not all be deleted: deleted when the apiserver answers (sweep.py)."""
        if self._sweeper is None:
            self._sweeper = Sweeper(self.api)
        self._sweeper.later(namespace, job_id, grace_s)

    def waiting_sweep(self) -> list[tuple[str, str]]:
        """(namespace, job id) of the ended jobs whose pods wait to be deleted."""
        return self._sweeper.waiting() if self._sweeper is not None else []

    def close(self) -> None:
        for collection in self._collections.values():
            collection.close()
        self._collections.clear()
        if self._sweeper is not None:
            self._sweeper.close()

    def _collection(self, kind: str, namespace: str) -> Optional[Collection]:
        if not self.watching:
            return None
        key = (kind, namespace)
        if key not in self._collections:
            self._collections[key] = Collection(self.api, kind, namespace, JOB_LABEL if kind == "pods" else "").start()
        return self._collections[key]

    def describe(self) -> str:
        return f"pods through {self.api.server or 'the kubeconfig'}'s apiserver; pod hosts in {self.state_dir}"


@dataclasses.dataclass
class _Pod:
    name: str
    generation: int
    uid: str = ""
    node: str = ""
    running: bool = False  # its container runs: its host can take runs
    bad: str = ""  # why it must be replaced, "" while it may run incarnations
    seen: bool = False  # in what the apiserver said since its creation
    ran: Optional[tuple[int, int]] = None  # the incarnation its host runs, None once stopped
    runs: int = 0  # incarnations handed to its host: more than one is a restart in place
    release_at: Optional[float] = None  # a spot release: marked DisruptionTarget and deleted then (runtime's clock)
    released: bool = False  # marked and deleted


class KubernetesRuntime(ClusterJob):
    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE,
                              Capability.STACK_DUMP, Capability.PREEMPT})
    places_itself = True

    def __init__(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float], site: KubeSite):
        super().__init__(job, cluster, clock)
        self.section = section_of(job.spec)
        self.site = site
        self.api = site.api
        self.pods: dict[str, _Pod] = {}
        self.pending: dict[str, tuple[int, int]] = {}
        self.avoid: set[str] = set()  # isolated here, or lost: no new pod goes there
        self.node_addresses: dict[str, str] = {}
        self.said: frozenset = frozenset()
        self.preempted_rounds: set[int] = set()
        self.checked = False
        self.failed = ""  # a permanent error: the job cannot run here
        self.errors = 0  # API calls that failed (transient ones included), counted
        self.last_error = ""
        self.created = 0
        self.recreated = 0
        self.in_place = 0
        self.released = 0  # pods a spot release marked DisruptionTarget and deleted
        self.pools = dict(job.spec.spot_pools)  # spot role -> its market pool: where its pods go
        self._next_watch = 0.0

    # ------------------------------------------------------------ protocol

    def start(self, name: str, round_: int, start: int) -> None:
        self.incarnation[name] = (round_, start)
        self.pending[name] = (round_, start)
        self._advance()

    def stop(self, names: Sequence[str], snapshot: str = "", incarnations=None) -> None:
        for name in names:
            self.pending.pop(name, None)
        # The agents stop what they adopted (stack dumps first when asked);
        # where no agent adopted it (CI's driver), the pod host stops it.
        self.stop_on_agents(names, snapshot, incarnations)
        for name in names:
            pod = self.pods.get(name)
            if pod is not None and pod.ran is not None and pod.uid and not pod.bad:
                self._drive(self.site.driver.stop, pod.node, pod.uid, self.spec.stop_grace_s)
                pod.ran = None

    def preempt(self, notice_s: float) -> None:
        """The market took a spot job's capacity back, as a cloud's spot
        reclaim does: SIGTERM to every incarnation in place (its pod's host,
        through the agents, SIGKILL after the pool's notice; none: at once),
        and once the notice is over each pod is marked DisruptionTarget and
        deleted (poll). From now on those pods are not the job's: the
        resumed round creates new ones when the market allows."""
        self.pending.clear()
        self.stop_on_agents(self.instance_names, "", dict(self.incarnation), grace_s=notice_s)
        release_at = self.clock() + max(notice_s, 0.0)
        for pod in self.pods.values():
            if pod.release_at is not None:
                continue
            if pod.ran is not None and pod.uid and not pod.bad:
                self._drive(self.site.driver.stop, pod.node, pod.uid, notice_s)
            pod.ran, pod.release_at = None, release_at
            pod.bad = "the spot market took its capacity back"
        self._release_due()

    def isolate_node(self, node: str, reason: str) -> None:
        self.avoid.add(node)
        # A node Kubernetes would not cordon is still avoided by this job's
        # pods (affinity); the failure is said, never the job's end.
        isolate(self.api, node, reason, on_error=self._say)
        self.say(NodeIsolated(node, reason))

    def poll(self) -> list[RuntimeEvent]:
        """Each turn of the actuator's loop: what Kubernetes says, then what waits."""
        now = self.clock()
        if now >= self._next_watch:
            self._next_watch = now + (LOOK_EVERY_S if self._watch() else LIST_EVERY_S)
        for event in self.site.followed(self.job_id):
            self.say(JobEvent(event))
        self._release_due()
        self._advance()
        return self.drain()

    def finish(self) -> None:
        """The job is over: every pod of it is deleted (the pod host stops
        what still runs, within the grace); none is left behind."""
        self.pending.clear()
        names = {pod.name for pod in self.pods.values()}
        listed = self._call(self.api.pods, self.section.namespace, job_selector(self.job_id))
        names |= {pod["metadata"]["name"] for pod in listed or ()}
        deleted = [self._call(self.api.delete_pod, name, self.section.namespace, int(self.spec.stop_grace_s))
                   for name in sorted(names)]
        self.pods.clear()
        if listed is None or None in deleted:
            # The apiserver did not answer: the site deletes them once it does.
            self.site.sweep_later(self.section.namespace, self.job_id, int(self.spec.stop_grace_s))
            self.say(EngineError(f"the pods of job {self.job_id} could not all be deleted ({self.last_error}); "
                                 f"they will be once the apiserver answers"))

    # ------------------------------------------------------------ acting

    def _advance(self) -> None:
        if self.failed:
            self._cannot_start()  # starts asked for since
            return
        if not self.pending:
            return
        if not self.checked:
            try:
                self.api.preflight(self.section.namespace, spot=bool(self.pools))
            except KubeError as exc:
                self._error(exc)  # unavailable: tried again next turn; else the job cannot run
                return
            self.checked = True
            self._adopt_pods()
        waiting = sorted(self.pending, key=lambda n: self.specs[n].rank)
        for name in waiting:
            pod = self.pods.get(name)
            if pod is not None and pod.node in self.avoid and not pod.bad:
                pod.bad = f"its node {pod.node} is to be avoided (isolated or lost)"
            if pod is None or pod.bad:
                self._create(name, pod)
        # What waits starts together, once every pod of it runs (a round's
        # ranks, or one instance's restart): a rank handed its run while
        # another's pod is still being scheduled would train, or wait at its
        # rendezvous, alone.
        for name in waiting:
            pod = self.pods.get(name)
            if pod is None or pod.bad or not pod.running or not self.site.driver.ready(pod.node, pod.uid):
                return  # the next turn
        master = self._master_address()
        if master is None:
            return
        for name in waiting:
            round_, start = self.pending.pop(name)
            self._run(name, self.pods[name], round_, start, master)

    def _adopt_pods(self) -> None:
        """The job's pods that exist already (a new actuator taking over):
        each instance's newest is its pod, run in place like any other; older
        generations are deleted. A pod is never created twice under one name."""
        listed = self._call(self.api.pods, self.section.namespace, job_selector(self.job_id)) or []
        newest: dict[str, tuple[int, dict]] = {}
        for pod in listed:
            view = pod_view(pod)
            generation = view.name.rsplit("-", 1)[-1]
            if view.instance not in self.specs or view.deleting or not generation.isdigit():
                continue
            if int(generation) > newest.get(view.instance, (-1, {}))[0]:
                if view.instance in newest:
                    self._call(self.api.delete_pod, newest[view.instance][1]["metadata"]["name"],
                               self.section.namespace, 0)
                newest[view.instance] = (int(generation), pod)
            else:
                self._call(self.api.delete_pod, view.name, self.section.namespace, 0)
        for instance, (generation, pod) in newest.items():
            view = pod_view(pod)
            self.pods[instance] = _Pod(view.name, generation, uid=view.uid, node=view.node, running=view.running,
                                       runs=1)

    def _create(self, name: str, old: Optional[_Pod]) -> None:
        """The instance's pod (its next generation, the old one deleted),
        away from every node to avoid. Created pods of a first round that
        cannot all be created are deleted again: no half-created job."""
        spec = self.specs[name]
        role = self.spec.role(spec.role)
        generation = old.generation + 1 if old is not None else 0
        if old is not None and old.release_at is not None:
            # Resumed before its release's notice was over: released now (marked, then deleted).
            if not old.released and not self._release(old):
                return  # the apiserver did not answer: the next turn
        elif old is not None:
            self._call(self.api.delete_pod, old.name, self.section.namespace, 0)
            self.recreated += 1
        round_ = self.pending[name][0]
        manifest = pod_manifest(
            job_id=self.job_id, spec=spec, world_size=len(self.specs), generation=generation, round_=round_,
            section=self._with_agent_dir(), command=[self.site.python, "-m", POD_HOST_MODULE, "--grace",
                                           str(self.spec.stop_grace_s), *(["--preload", ",".join(self.spec.preload)]
                                                                          if self.spec.preload else [])],
            env=job_env(self.spec, role, self.settings), master_addr=self._master_address() or "",
            master_port=master_port(self.job_id, round_), avoid_nodes=sorted(self.avoid),
            host_network=self.site.host_network, state_dir=self.site.state_dir, grace_s=self.spec.stop_grace_s,
            workdir=self.spec.workdir, pool=self.pools.get(spec.role, ""))
        created = self._call(self.api.create_pod, manifest)
        if created is None:
            if self.failed:
                self._undo()
            return
        self.created += 1
        self.pods[name] = _Pod(manifest["metadata"]["name"], generation, uid=created["metadata"].get("uid", ""))

    def _release_due(self) -> None:
        """The pods of a spot release whose notice is over: marked and deleted."""
        now = self.clock()
        for pod in self.pods.values():
            if pod.release_at is not None and not pod.released and now >= pod.release_at:
                self._release(pod)

    def _release(self, pod: _Pod) -> bool:
        """The pod marked DisruptionTarget (its status), then deleted, as a
        cloud's spot reclaim does; False when the apiserver did not answer
        (tried again next turn). A pod gone already needs neither."""
        namespace = self.section.namespace
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = release_condition(f"the spot market took the capacity of job {self.job_id} back (a price above "
                                      f"its bid or stock short); its instances had the pool's notice", stamp)
        marked = self._call(self.api.patch_pod_status, pod.name, namespace, condition)
        if marked is None and not self.failed:
            return False
        # Refused for good (said once, the job cannot run here): deleted all the same, the capacity is the market's.
        if marked is not False and self._call(self.api.delete_pod, pod.name, namespace, RELEASE_GRACE_S) is None \
                and not self.failed:
            return False
        pod.released = True
        self.released += 1
        return True

    def _with_agent_dir(self) -> KubernetesSection:
        if not self.site.agent_dir:
            return self.section
        mount = HostPath(self.site.agent_dir)
        return dataclasses.replace(self.section, host_paths=(*self.section.host_paths, mount))

    def _undo(self) -> None:
        for pod in self.pods.values():
            self._call(self.api.delete_pod, pod.name, self.section.namespace, 0)
        self.pods.clear()

    def _run(self, name: str, pod: _Pod, round_: int, start: int, master: str) -> None:
        spec = self.specs[name]
        role = self.spec.role(spec.role)
        env = instance_env(
            base={}, job_id=self.job_id, spec=spec, world_size=len(self.specs), round_=round_, start=start,
            max_restarts=self.settings.max_num_of_job_restart, master_addr=master,
            master_port=master_port(self.job_id, round_), control_address="", token=secrets.token_urlsafe(24),
            sdk_path="", extra=job_env(self.spec, role, self.settings), node=pod.node)
        for key in ("TRAINWARDEN_SDK_SOCKET", "PYTHONPATH"):
            env.pop(key, None)  # the node's (its agent's endpoint) and the image's
        if pod.runs:
            self.in_place += 1
        pod.ran, pod.runs = (round_, start), pod.runs + 1
        self.cluster.placement.setdefault(self.job_id, {})[name] = pod.node
        self.nodes_used.add(pod.node)
        asked = {**job_env(self.spec, role, self.settings), POD_UID_VARIABLE: pod.uid}
        run = PodRun(StartInstance(
            node=pod.node, job_id=self.job_id, action_id=f"{self.job_id}/{name}/{round_}/{start}", instance=spec,
            round=round_, start=start, world_size=len(self.specs), master_addr=master,
            master_port=master_port(self.job_id, round_), command=tuple(role.command),
            env=tuple(sorted(asked.items())), workdir=self.spec.workdir,
            max_restarts=self.settings.max_num_of_job_restart), env)
        said = self._drive(self.site.driver.run, run)
        if said is None:
            self.pending[name] = (round_, start)  # the host did not take it: the next turn
            pod.ran = None
            return
        for event in said:
            self.say(event)

    def _master_address(self) -> Optional[str]:
        rank0 = min(self.specs.values(), key=lambda s: s.rank).name
        pod = self.pods.get(rank0)
        if pod is None or not pod.node:
            return None
        if self.site.rendezvous_by_name:
            return pod.node
        return self.node_addresses.get(pod.node) or pod.node

    # ------------------------------------------------------------ watching

    def _watch(self) -> bool:
        """What the job's pods and their nodes say; True when it came from the watch."""
        found = self._call(self.site.job_pods, self.section.namespace, self.job_id)
        nodes = self._call(self.site.nodes)
        if found is None or nodes is None:
            return False
        listed, watched = found
        node_views = {view.name: view for view in map(node_view, nodes)}
        self.node_addresses = {name: view.address for name, view in node_views.items() if view.address}
        by_name = {pod.name: name for name, pod in self.pods.items()}
        current = {}
        views = [pod_view(pod) for pod in listed]
        for view in views:
            name = by_name.get(view.name)
            if name is None:
                continue
            pod = self.pods[name]
            pod.uid, pod.node, pod.running, pod.seen = view.uid or pod.uid, view.node, view.running, True
            if pod.release_at is not None:
                continue  # released by the market: not the job's any more (its own DisruptionTarget is no news)
            round_, start = self.incarnation.get(name, (0, 0))
            current[view.name] = Incarnation(name, round_, start)
            node = node_views.get(view.node)
            if view.node and (node is None or not node.ready):
                self.avoid.add(view.node)
                pod.bad = pod.bad or f"its node {view.node} is lost"
            elif view.node and node is not None and node.isolated:
                pod.bad = pod.bad or f"its node {view.node} is isolated"
            elif view.disruption or view.deleting:
                pod.bad = pod.bad or f"Kubernetes took it away ({view.disruption or 'deleted'})"
            elif view.exit_code is not None:
                pod.bad = pod.bad or f"its container ended ({view.exit_reason or view.exit_code})"
        seen = {view.name for view in views}
        for name, pod in self.pods.items():
            # A list holds every pod created before it; the watch's copy may not hold one just created.
            if pod.name not in seen and pod.uid and (pod.seen or not watched):
                pod.bad = pod.bad or "it is gone"
        events, self.said = translate(self.job_id, self.clock(), views, node_views, current, self.said)
        for event in events:
            if isinstance(event, Preempted):
                if event.round in self.preempted_rounds:
                    continue  # one preemption a round, however many pods went
                self.preempted_rounds.add(event.round)
                self.say(CapacityTaken(event.round, event.reason))
            elif isinstance(event, NodeLost):
                self.say(NodeDown(event.node, tuple(event.instances)))
            else:
                self.say(JobEvent(event))
        return watched

    # ------------------------------------------------------------ errors

    def _call(self, fn, *args):
        """fn's result; None (counted and said) when the API failed: tried
        again next turn, or, for a permanent error, the job cannot run."""
        try:
            return fn(*args)
        except KubeError as exc:
            self._error(exc)
            return None

    def _drive(self, fn, *args) -> Optional[list]:
        """The driver's call and what it has to say ([] for nothing); None
        (counted) when the pod host did not take it: tried again next turn."""
        try:
            return list(fn(*args) or ())
        except (PodHostError, OSError) as exc:
            self.errors += 1
            self.last_error = str(exc)
            return None

    def _say(self, exc: KubeError) -> None:
        self.errors += 1
        self.last_error = str(exc)
        self.say(EngineError(str(exc)))

    def _error(self, exc: KubeError) -> None:
        self.errors += 1
        self.last_error = str(exc)
        if exc.permanent and not self.failed:
            self.failed = str(exc) + (f" (hint: {exc.hint})" if exc.hint else "")
            self.say(EngineError(self.failed))
            self._cannot_start()

    def _cannot_start(self) -> None:
        """The cluster cannot run the job (permanent): each incarnation waiting
        to start ends as a command that could not start (127), its one line
        saying why, so the engine ends the job as for any such exit."""
        now = self.clock()
        for name, (round_, start) in sorted(self.pending.items()):
            self.say(JobEvent(LogLine(job_id=self.job_id, time=now, instance=name, round=round_, start=start,
                                      text=f"trainwarden: the job cannot run on Kubernetes: {self.failed}",
                                      stream=Stream.STDERR)))
            self.say(JobEvent(InstanceExited(job_id=self.job_id, time=now, instance=name, round=round_, start=start,
                                             exit_code=CANNOT_START)))
        self.pending.clear()


def isolate(api: KubeApi, node: str, reason: str, on_error: Callable[[KubeError], None] = None) -> bool:
    """Cordon and taint the node, its reason in an annotation; False when the API refused (said to on_error)."""
    try:
        current = api.node(node)
        if current is None:
            return False
        patch = isolate_patch(reason)
        patch["spec"]["taints"] = with_isolation_taint((current.get("spec") or {}).get("taints"), reason)
        api.patch_node(node, patch)
        return True
    except KubeError as exc:
        if on_error is None:
            raise
        on_error(exc)
        return False


def uncordon(api: KubeApi, node: str) -> bool:
    """``trainwarden nodes uncordon NODE``: undo an isolation by Trainwarden
    (only: a node cordoned by someone else, with no taint of ours, stays as
    it is). True when there was one to undo."""
    current = api.node(node)
    if current is None:
        return False
    taints = (current.get("spec") or {}).get("taints") or []
    if not any(t.get("key") == ISOLATED_TAINT for t in taints):
        return False
    api.patch_node(node, uncordon_patch(taints))
    return True

