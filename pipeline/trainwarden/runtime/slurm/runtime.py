"""The ``slurm`` runtime: one job's instances as the tasks of Slurm steps.

The job holds one allocation (a holder batch job, ``--requeue``, one node
per instance). Each round is one step in it: one task per instance, run by
``task.py`` with the plan this runtime writes (commands, and the environment
every runtime builds), torchrun's variables taken from Slurm's. The node
agents adopt the tasks Slurm put on their nodes (``adopt.py``): they ship
the output, report exits, serve the SDK, dump stacks and stop the tasks, as
for their own instances.

- Restarting the job is a new step in the same allocation while it still
  holds; when it holds a node Trainwarden isolated, the allocation is
  requeued with that node excluded and started at once.
- Restarting one instance (Async jobs) stops only its task (through the
  agent that adopted it) and starts it as the one task of a step of its
  own in the same allocation, beside the round's step (``--overlap``: that
  step keeps its cores until all its tasks end), on the node it ran on
  unless that node is to be avoided. It is announced and adopted like any
  task, and keeps the Slurm variables of its task in the round's step
  (parse.round_task_env), so its rank, world size and master are the
  round's.
- Isolating a node drains it (``Reason`` says why, from Trainwarden); the
  next round excludes it. ``trainwarden nodes uncordon`` resumes it. While
  the allocation waits to run again, it excludes exactly the nodes to
  avoid now: one avoided only for a moment is allowed again.
- A node Slurm reports down while it holds the job's tasks is node loss.
- Slurm taking the allocation back while its nodes are up (a higher
  priority job preempted it: requeued, or ended with PREEMPTED; or an
  operator requeued it) is a preemption, said to the engine as such: not a
  fault. The next round starts when Slurm runs the allocation again.
- A spot job the market takes back (``preempt``, the engine's requeue) is
  released as on the agents runtime: SIGTERM to every task through the
  agents that adopted them, and after the pool's notice the release: the
  allocation is cancelled, so nothing is held in Slurm while the job waits
  in the bidding queue; the next round asks for a new one. Its first
  allocation is asked for only once the engine starts it (the market allows).
- A job that preloads (``preload:``) gets a standby host on each node of
  each allocation run (standby_host.py): a step of its own that overlaps
  the rounds' steps, started before the first round, which waits for the
  hosts to listen (at most ``HOST_READY_S``). The tasks hand their
  instances to its warm interpreters (task.py).
- With ``--run-as USER`` (the actuator's: it is the one that submits) the
  allocation and every step run as that user (SlurmCli's ``--uid``). The
  directories the tasks write (outputs, manifests, standby) are given to
  that user; what only the actuator writes (the plans, with the tokens) is
  root's, readable by the user's group only. Writing there lets the job
  forge a manifest, not an adoption: the agent adopts a pid only for a
  token in that process's own environment (adopt.py, proof.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from trainwarden.bus.messages import ExpectTasks
from trainwarden.diagnose.collect import DEFAULT_TIMEOUT_S
from trainwarden.runtime.agents import ClusterJob
from trainwarden.runtime.base import (Capability, CapacityTaken, EngineError, JobToRun, NodeDown, NodeIsolated,
                                      RuntimeEvent)
from trainwarden.runtime.environment import job_env, sdk_import_dir
from trainwarden.runtime.nodes import Cluster, master_port
from trainwarden.runtime.run_as import RunAs, share_sdk_path
from trainwarden.runtime.adoption import token_digest
from trainwarden.runtime.nodehost import StartOrder, planned_env
from trainwarden.runtime.slurm.handoff import TASK_TOKENS, in_workdir, ready_name
from trainwarden.runtime.slurm.cli import SlurmCli, SlurmError
from trainwarden.runtime.slurm.parse import JobState, NodeState, SlurmJob, round_task_env

NODES_EVERY_S = 2.0
REASON_PREFIX = "Trainwarden"
# A host listens within a second; one that does not by then (a broken
# interpreter, a node without kcmp) leaves its tasks to start fresh.
HOST_READY_S = 15.0


@dataclasses.dataclass
class _Step:
    """An srun client and the instances of its step not asked to stop yet."""

    proc: subprocess.Popen
    names: set[str]
    asked: float = 0.0  # when the last of them was asked to stop


class SlurmSite:
    """Where this actuator reaches Slurm: its CLI and the shared directory
    (plans, task manifests, output files, the agents' SDK addresses).
    python: the interpreter the task wrappers run with on the nodes (this
    one's by default; with --run-as it must be one that user can execute)."""

    def __init__(self, cli: SlurmCli, directory: Path, python: str = sys.executable):
        self.cli = cli
        self.directory = Path(directory)
        self.python = python

    def runtime(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float]) -> "SlurmRuntime":
        return SlurmRuntime(job, cluster, clock, self)

    def node_state(self, node: str, isolated: bool, reason: str) -> list[RuntimeEvent]:
        """An isolation or uncordon (a rule's or an operator's) of a Slurm node is done in Slurm too."""
        try:
            found = self.cli.node(node)
            if found is None:
                return []  # not a Slurm node
            drained = found.drain or found.state in (NodeState.DRAINED, NodeState.DRAINING)
            if isolated and not drained:
                self.cli.drain(node, f"{REASON_PREFIX}: {reason or 'isolated'}")
            elif not isolated and drained and found.reason.startswith(REASON_PREFIX):
                self.cli.resume(node)  # only what Trainwarden drained
        except SlurmError as exc:
            return [EngineError(str(exc))]
        return []

    def describe(self) -> str:
        return f"Slurm jobs in {self.directory}"


class SlurmRuntime(ClusterJob):
    capabilities = frozenset({Capability.RESTART_JOB, Capability.RESTART_INSTANCE, Capability.ISOLATE_NODE,
                              Capability.STACK_DUMP, Capability.PREEMPT})
    places_itself = True

    def __init__(self, job: JobToRun, cluster: Cluster, clock: Callable[[], float], site: SlurmSite):
        super().__init__(job, cluster, clock)
        job_id = job.job_id
        self.slurm = site.cli
        self.pending: dict[str, tuple[int, int]] = {}  # starts asked for, not launched yet
        self.excluded: set[str] = set()  # isolated by Trainwarden: drained
        self.down: set[str] = set()  # Slurm says down or not responding: avoided while it lasts
        self.allocation: Optional[int] = None
        self.release_at: Optional[float] = None  # a spot release's end: the allocation cancelled then
        self.steps: list[_Step] = []
        # Launched in a step and not asked to stop since (ended on their own included):
        # while the others are, a start is a lone restart, not a round waiting for its instances.
        self.launched: set[str] = set()
        self.ran_on: dict[str, str] = {}  # where each instance last ran: a lone restart goes back there
        self.reported_down: set[str] = set()
        # The allocation run the launched instances are in, as Slurm said when they were launched.
        self.run_seen: Optional[SlurmJob] = None
        self.errors = 0
        self.last_error = ""
        self._next_nodes = 0.0
        self.directory = site.directory / job_id
        self.outputs = site.directory / "outputs"
        self.manifests = site.directory / "manifests"
        self.control_dir = site.directory / "control"
        for path in (self.directory, self.outputs, self.manifests, self.control_dir):
            path.mkdir(parents=True, exist_ok=True)
        self.sdk_path = sdk_import_dir(site.directory / "sdk")
        # The standby hosts of the allocation run they were started for: (job, restarts).
        self.host_run: Optional[tuple[int, int]] = None
        self.host_step: Optional[subprocess.Popen] = None
        self.host_since = 0.0
        self.standby_dir = self.directory / "standby"
        self.python = site.python
        self.run_as: Optional[RunAs] = site.cli.run_as
        if self.run_as is not None:
            self._share(site.directory)

    def _share(self, shared: Path) -> None:
        """What the tasks, run as another user, must reach: the shared
        directory searchable, the plans readable by the user's group, the
        directories the tasks write the user's own."""
        run_as = self.run_as
        os.chmod(shared, os.stat(shared).st_mode | 0o111)
        os.chown(self.directory, os.geteuid(), run_as.gid)
        os.chmod(self.directory, 0o750)  # the plans: the user reads them, never writes one
        self.standby_dir.mkdir(exist_ok=True)
        for path in (self.outputs, self.manifests, self.standby_dir):
            run_as.give(path)
        os.chmod(self.control_dir, 0o755)  # the agents' addresses: read by the tasks
        share_sdk_path(self.sdk_path)

    # ------------------------------------------------------------ protocol

    def start(self, name: str, round_: int, start: int) -> None:
        self.incarnation[name] = (round_, start)
        self.pending[name] = (round_, start)
        self._try_launch()

    def stop(self, names: Sequence[str], snapshot: str = "", incarnations=None) -> None:
        self._stop(names, snapshot, incarnations)

    def _stop(self, names: Sequence[str], snapshot: str, incarnations, grace_s: Optional[float] = None) -> None:
        placed = self.cluster.placement.get(self.job_id, {})
        for name in names:
            self.pending.pop(name, None)
            self.launched.discard(name)
            if name in placed:
                self.ran_on[name] = placed[name]
        self.stop_on_agents(names, snapshot, incarnations, grace_s=grace_s)
        # The agents stop what they adopted; a step that outlives that (a task
        # never adopted, an agent gone) is ended through Slurm, once none of
        # its instances is to go on: a lone restart leaves the round's step running.
        now = self.clock()
        for step in self.steps:
            step.names.difference_update(names)
            if not step.names and not step.asked:
                step.asked = now

    def isolate_node(self, node: str, reason: str) -> None:
        self.slurm.drain(node, f"{REASON_PREFIX}: {reason}")
        self.excluded.add(node)
        self.say(NodeIsolated(node, reason))

    def preempt(self, notice_s: float) -> None:
        """The market took a spot job's capacity back: SIGTERM to every task
        now (through the agents that adopted them, as on the agents runtime,
        which SIGKILL what is left after the notice), and the release once
        the pool's notice is over (none: at once): the allocation ended."""
        self._stop(self.instance_names, "", dict(self.incarnation), grace_s=max(notice_s, 0.0))
        self.release_at = self.clock() + max(notice_s, 0.0)
        self._release_when_due()

    def _release_when_due(self) -> None:
        """The notice is over: the allocation is cancelled (its steps and
        standby hosts with it), so the queued job holds nothing in Slurm.
        A cancel Slurm refuses is tried again next turn."""
        if self.release_at is None or self.clock() < self.release_at:
            return
        if self.allocation is not None:
            try:
                self.slurm.cancel(self.allocation)
            except SlurmError as exc:
                self._failed(exc)
                return
        self.release_at = None
        self._let_go()

    def poll(self) -> list[RuntimeEvent]:
        """Each turn of the actuator's loop: watch the nodes, launch what
        waits, end steps that outlived their stop."""
        now = self.clock()
        if now >= self._next_nodes:
            self._next_nodes = now + NODES_EVERY_S
            self._watch_nodes()
            self._watch_allocation()
        self._release_when_due()
        self._try_launch()
        self._end_late_steps()
        return self.drain()

    def finish(self) -> None:
        self.pending.clear()
        self.launched.clear()
        self.release_at = None
        if self.allocation is not None:
            self._call(self.slurm.cancel, self.allocation)
        self._let_go()

    def _let_go(self) -> None:
        """The allocation is cancelled (or gone): its srun clients and hosts' step too."""
        for step in self.steps:
            if step.proc.poll() is None:
                step.proc.kill()
        self.steps = []
        if self.host_step is not None and self.host_step.poll() is None:
            self.host_step.kill()  # the allocation's end ends the hosts' step
        self.host_step = None
        self.host_run = None
        self.allocation = None
        self.run_seen = None  # its end is ours, not a preemption by Slurm

    # ------------------------------------------------------------ launching

    def _try_launch(self) -> None:
        if not self.pending or self.release_at is not None:
            return  # a round started within a release's notice waits for a new allocation
        alone = set(self.pending) != set(self.instance_names)
        # One step runs a round's instances: wait until each has been asked
        # for, unless the others still run (a lone restart).
        if alone and not all(name in self.pending or name in self.launched for name in self.instance_names):
            return
        # A lone restart must not requeue the allocation under the instances that go on.
        job = self._allocation_ready(requeue=not alone)
        if job is None:
            return
        if self.spec.preload and not self._hosts_ready(job):
            return
        if not alone:
            self._launch(job)
            return
        for name in list(self.pending):
            self._launch_alone(job, name)

    def _hosts_ready(self, job) -> bool:
        """The standby hosts of this allocation run listen (or will not):
        started with its first round, which waits for them."""
        run = (job.job_id, job.restarts)
        now = self.clock()
        if self.host_run != run:
            if self.host_step is not None and self.host_step.poll() is None:
                self.host_step.kill()  # an earlier run's: Slurm ended its step with that run
            self.host_run, self.host_since = run, now
            self.host_step = self._call(
                self.slurm.launch_step, job.job_id, len(self.instance_names),
                [self.python, "-m", "trainwarden.runtime.slurm.standby_host", "--ready-dir",
                 str(self.standby_dir), "--restart", str(job.restarts), *self.spec.preload],
                output_dir=self.standby_dir, name=f"tw-{self.job_id}-standby", overlap=True)
            if self.host_step is None:
                return True  # Slurm refused it: the rounds start fresh
        if self.host_step is None or self.host_step.poll() is not None or now - self.host_since > HOST_READY_S:
            return True
        return all((self.standby_dir / ready_name(job.job_id, job.restarts, node)).exists() for node in job.nodes)

    def _allocation_ready(self, requeue: bool = True):
        """The allocation, when it runs on nodes none of which is excluded
        (any, without ``requeue``); else None (and the step towards it)."""
        avoid = sorted(self.excluded | self.down)
        if self.allocation is None:
            self.allocation = self._call(self.slurm.allocate, f"tw-{self.job_id}", len(self.instance_names),
                                         exclude=avoid, output_dir=self.outputs)
            return None
        job = self._call(self.slurm.job, self.allocation)
        if job is None or job.state.finished and job.state not in (JobState.REQUEUED,):
            self.allocation = None  # gone (cancelled, failed): a new one next turn
            return None
        if job.state is JobState.RUNNING:
            if requeue and set(job.nodes) & set(avoid):
                # A new step would land on a node to avoid: a new allocation, at once.
                self._call(self.slurm.requeue_now, self.allocation, exclude=avoid)
                return None
            return job
        if job.state is JobState.PENDING and set(job.excluded) != set(avoid):
            # What to avoid changed while it waits: a node avoided when it was
            # requeued only for a moment (Slurm says a node it just resumed is
            # not responding until its next ping) would keep it pending for
            # ever once too few nodes are left to it ("BadConstraints").
            self._call(self.slurm.exclude, self.allocation, avoid)
        if job.state in (JobState.PENDING, JobState.REQUEUED) and "BeginTime" in job.reason:
            # Slurm's own requeue (a node failed) holds the job for about 120 s.
            self._call(self.slurm.run, ["scontrol", "update", f"jobid={self.allocation}", "StartTime=now"])
        return None

    def _plan_entry(self, name: str, round_: int, start: int, token: str) -> dict:
        """One instance of a plan: its command and the environment every runtime builds."""
        spec = self.specs[name]
        role = self.spec.role(spec.role)
        order = StartOrder(job_id=self.job_id, spec=spec, command=(), round=round_, start=start,
                           world_size=len(self.specs), max_restarts=self.settings.max_num_of_job_restart,
                           master_addr="", master_port=0, env=job_env(self.spec, role, self.settings))
        # Slurm's and the node's variables are left out: task.py sets them (torchrun's from Slurm's).
        env = planned_env(order, token, self.sdk_path)
        command = list(role.command)
        if self.spec.workdir:
            command = in_workdir(self.spec.workdir, command)
        return {"name": name, "command": command, "env": env}

    def _write_plan(self, entries: list, round_: int, job, label: str) -> Path:
        plan = {"instances": entries, "master_addr": None, "master_port": master_port(self.job_id, round_),
                "manifest_dir": str(self.manifests), "output_dir": str(self.outputs),
                "control_dir": str(self.control_dir), "restart": job.restarts, "standby": bool(self.spec.preload)}
        path = self.directory / f"plan-r{round_}{label}-{int(time.time() * 1000)}.json"
        # Created 0640: the tokens in it are the job's own user's to read, no one else's.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w") as f:
            if self.run_as is not None:
                os.fchown(f.fileno(), os.geteuid(), self.run_as.gid)
            f.write(json.dumps(plan))
        return path

    def _launch(self, job) -> None:
        launch, self.pending = dict(self.pending), {}
        round_ = max(r for r, _ in launch.values())
        plan_instances, announced, tokens = [], [], []
        for name in self.instance_names:
            inc_round, start = launch[name]
            token = secrets.token_urlsafe(24)
            plan_instances.append(self._plan_entry(name, inc_round, start, token))
            announced.append((name, inc_round, start, token_digest(token)))
            tokens.append(token)
        path = self._write_plan(plan_instances, round_, job, "")
        # Announced first: an agent adopts a task only for a token it was told of.
        self.send(ExpectTasks(node="*", job_id=self.job_id, allocation=job.job_id,
                                           incarnations=tuple(announced)))
        proc = self._call(self.slurm.launch_step, job.job_id, len(plan_instances),
                          [self.python, "-m", "trainwarden.runtime.slurm.task", str(path)],
                          output_dir=self.outputs, name=f"tw-{self.job_id}-r{round_}",
                          # What the agents check a task's wrapper by (proof.py): a
                          # standby, or an instance gone before its agent looked.
                          env={TASK_TOKENS: " ".join(tokens)})
        if proc is None:
            self.pending = launch  # tried again next turn
        else:
            self.steps.append(_Step(proc, set(launch)))
            self.launched.update(launch)
            self.run_seen = job
            for index, name in enumerate(self.instance_names):
                if index < len(job.nodes):  # one task per node, in the allocation's node order
                    self._placed(name, job.nodes[index])

    def _launch_alone(self, job, name: str) -> None:
        """One instance restarted while the others run: the one task of a step of its own."""
        node = self._node_for(job, name)
        if node is None:
            return  # every node of the allocation is to be avoided: it waits for the next round
        round_, start = self.pending.pop(name)
        token = secrets.token_urlsafe(24)
        entry = self._plan_entry(name, round_, start, token)
        entry["as_task"] = round_task_env(self.instance_names.index(name), job.nodes)
        path = self._write_plan([entry], round_, job, f"-{name}-s{start}")
        self.send(ExpectTasks(node="*", job_id=self.job_id, allocation=job.job_id,
                                           incarnations=((name, round_, start, token_digest(token)),)))
        # --overlap: the round's step holds its cores until every one of its tasks has ended.
        proc = self._call(self.slurm.launch_step, job.job_id, 1,
                          [self.python, "-m", "trainwarden.runtime.slurm.task", str(path)],
                          output_dir=self.outputs, name=f"tw-{self.job_id}-r{round_}-{name}-s{start}",
                          nodelist=[node], overlap=True, env={TASK_TOKENS: token})
        if proc is None:
            self.pending[name] = (round_, start)
        else:
            self.steps.append(_Step(proc, {name}))
            self.launched.add(name)
            self._placed(name, node)

    def _placed(self, name: str, node: str) -> None:
        """Where Slurm runs the task just launched: a stop (or a node's loss)
        that comes before its agent's first heartbeat still finds it there.
        The heartbeats say where it really runs (heard)."""
        self.cluster.placement.setdefault(self.job_id, {})[name] = node

    def _node_for(self, job, name: str) -> Optional[str]:
        """Where a lone restart runs: where the instance ran (its task's node
        in the round's step, if no agent said), else any node of the
        allocation not to be avoided."""
        avoid = self.excluded | self.down
        usable = [node for node in job.nodes if node not in avoid]
        index = self.instance_names.index(name)
        for node in (self.ran_on.get(name), job.nodes[index] if index < len(job.nodes) else None):
            if node in usable:
                return node
        return usable[0] if usable else None

    def _end_late_steps(self) -> None:
        late_after = self.spec.stop_grace_s + DEFAULT_TIMEOUT_S + 10.0
        now = self.clock()
        kept = []
        for step in self.steps:
            if step.proc.poll() is not None:
                continue
            if step.asked and now - step.asked > late_after:
                step.proc.kill()  # srun gone: Slurm ends the step
                continue
            kept.append(step)
        self.steps = kept

    # ------------------------------------------------------------ nodes

    def _watch_nodes(self) -> None:
        placed = self.cluster.placement.get(self.job_id, {})
        nodes = self._call(self.slurm.nodes)
        for node in nodes or ():
            down = node.state in (NodeState.DOWN, NodeState.FAIL) or node.not_responding
            if down:
                self.down.add(node.name)
            else:
                self.down.discard(node.name)
            on_it = sorted(name for name, where in placed.items() if where == node.name)
            if down and on_it and node.name not in self.reported_down:
                self.reported_down.add(node.name)
                self.say(NodeDown(node.name, tuple(on_it)))
            elif not down:
                self.reported_down.discard(node.name)

    def _watch_allocation(self) -> None:
        """Slurm took the allocation the round runs in back while its nodes
        are up: preempted by a higher-priority job (requeued, or PREEMPTED
        when the site cancels), or requeued by an operator. Said once per run;
        a run lost with a node is node loss (_watch_nodes), not this."""
        run = self.run_seen
        if run is None or self.allocation != run.job_id or not self.launched:
            return
        job = self._call(self.slurm.job, self.allocation)
        if job is None:
            return
        if job.state is JobState.PREEMPTED:
            why = f"Slurm preempted allocation {run.job_id}"
        elif job.restarts > run.restarts:
            why = (f"Slurm requeued allocation {run.job_id} (restart {job.restarts}) while its nodes were up: "
                   f"preempted by a higher-priority job, or requeued by an operator")
        else:
            return
        self.run_seen = None
        if set(run.nodes) & self.down:
            return  # a node of it is down: node loss, said as such
        rounds = [self.incarnation[name][0] for name in self.launched if name in self.incarnation]
        if rounds:
            self.say(CapacityTaken(max(rounds), why))

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SlurmError as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: SlurmError) -> None:
        # Slurm's controller restarting, a command timing out: said, and tried again next turn.
        self.errors += 1
        self.last_error = str(exc)
        self.say(EngineError(str(exc)))
