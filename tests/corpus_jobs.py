"""What a restart policy costs on the real-failure corpus: each excerpt run
as a job through the engine on the virtual clock (simulation/cluster.py).

The job: two workers in Sync mode on two nodes, reporting their step with
the SDK (``report_progress``) every 100 s of training and checkpointing
every 100 steps. The excerpt's instance (worker-0) fails with the excerpt's
exit code and lines, in the excerpt's phase (``# phase:``):

- ``initialisation``: 120 s after its round starts, before any step;
- ``training``, ``evaluation``, ``checkpoint``: after reporting steps 100,
  200 and 250 (the first round), at 300 s; a restart resumes from the
  checkpoint of step 200;
- ``unknown``: as ``UNKNOWN_AS`` says (``--unknown-phase`` of the bench).

A transient failure (label ``retryable``) succeeds after its first restart:
the restarted round trains past where it failed and both workers exit 0. A
persistent one (``not_retryable``) fails again the same way, in the same
phase (the same step: 250 after a resume from 200), at every restart.
Excerpts labelled ``unknown`` are not run.

A job is lost when it ends failed although its failure was transient;
restarts are every job restart and instance restart the engine decided.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from tests.corpus import Excerpt
from trainwarden.engine.state import JobStatus
from trainwarden.events import DecisionKind, SdkOp
from trainwarden.rules.model import RulePack
from trainwarden.simulation.cluster import VirtualCluster, instance_specs

# The shipped policy: the shipped rule pack and default flags, with job
# restarts switched on (off by default: fault tolerance is asked for).
SHIPPED = "--enable-job-restart=True"
# Every failure restarted whatever its lines say, up to the default limits.
ALWAYS_RETRY = "--enable-job-restart=True --fault-tolerant-policy=OnFailure"
# torchrun's default, --max-restarts=0: a failure ends the job.
TORCHRUN_DEFAULT = "--enable-job-restart=False --fault-tolerant-policy=OnFailure"
POLICIES = (("Trainwarden (shipped)", SHIPPED), ("always retry", ALWAYS_RETRY),
            ("torchrun --max-restarts=0", TORCHRUN_DEFAULT))
MAX_ROUNDS = 50  # far above any limit: a policy that never stops is reported, not looped on
PHASES_AFTER_PROGRESS = ("training", "evaluation", "checkpoint")
UNKNOWN_AS = ("training", "initialisation")


@dataclasses.dataclass(frozen=True)
class JobRun:
    excerpt: Excerpt
    phase: str  # the phase it was run in
    status: str  # succeeded, failed, running (past MAX_ROUNDS)
    restarts: int
    final_rule: str  # the rule of the last decision on a failure

    @property
    def lost(self) -> bool:
        return self.excerpt.expect == "retryable" and self.status != "succeeded"


def _fail_round(cluster: VirtualCluster, excerpt: Excerpt, phase: str, first: bool) -> None:
    t0 = cluster.now
    if phase in PHASES_AFTER_PROGRESS:
        steps = (100, 200, 250) if first else (200, 250)
        for index, step in enumerate(steps):
            cluster.advance(t0 + 100 * (index + 1) - 50)
            for name in cluster.state.instances:
                if not cluster.state.finished:
                    cluster.sdk(name, SdkOp.REPORT_PROGRESS, step=step)
        cluster.advance(t0 + 300)
    else:
        cluster.advance(t0 + 120)
    if not cluster.state.finished:
        cluster.exit("worker-0", excerpt.exit_code, excerpt.lines)
    _settle(cluster)


def _succeed_round(cluster: VirtualCluster) -> None:
    t0 = cluster.now
    for index, step in enumerate((300, 400, 500)):
        cluster.advance(t0 + 100 * (index + 1))
        for name in cluster.state.instances:
            cluster.sdk(name, SdkOp.REPORT_PROGRESS, step=step)
    cluster.advance(t0 + 400)
    for name in list(cluster.state.instances):
        if not cluster.state.finished:
            cluster.exit(name, 0)
    _settle(cluster)


def _settle(cluster: VirtualCluster) -> None:
    """Let the windows the engine waits in (attribution, platform notice) end."""
    for _ in range(3):
        if cluster.state.finished:
            return
        cluster.advance(cluster.now + 10)
        cluster.tick()


def run_job(pack: RulePack, excerpt: Excerpt, args: str, unknown_as: str = "training") -> JobRun:
    phase = excerpt.phase if excerpt.phase != "unknown" else unknown_as
    cluster = VirtualCluster(pack, job_id="corpus", args=args, instances=instance_specs([("worker", 2)]))
    persistent = excerpt.expect == "not_retryable"
    rounds = 0
    while not cluster.state.finished and rounds < MAX_ROUNDS:
        if rounds and not persistent:
            _succeed_round(cluster)
        else:
            _fail_round(cluster, excerpt, phase, first=rounds == 0)
        rounds += 1
    restarts = sum(td.decision.kind in (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE)
                   for td in cluster.decisions)
    failures = [td.decision for td in cluster.decisions if td.decision.error_source is not None]
    status = cluster.state.status.value if cluster.state.finished else JobStatus.RUNNING.value
    return JobRun(excerpt, phase, status, restarts, failures[-1].rule if failures else "")


@dataclasses.dataclass(frozen=True)
class Costs:
    runs: tuple[JobRun, ...]

    @property
    def transient(self) -> list[JobRun]:
        return [r for r in self.runs if r.excerpt.expect == "retryable"]

    @property
    def persistent(self) -> list[JobRun]:
        return [r for r in self.runs if r.excerpt.expect == "not_retryable"]

    @property
    def lost_share(self) -> float:
        transient = self.transient
        return sum(r.lost for r in transient) / len(transient) if transient else 0.0

    @property
    def restarts_per_persistent(self) -> float:
        persistent = self.persistent
        return sum(r.restarts for r in persistent) / len(persistent) if persistent else 0.0

    @property
    def restarts_per_transient(self) -> float:
        transient = self.transient
        return sum(r.restarts for r in transient) / len(transient) if transient else 0.0


def costs(pack: RulePack, excerpts: Iterable[Excerpt], args: str = SHIPPED,
          unknown_as: str = "training") -> Costs:
    return Costs(tuple(run_job(pack, e, args, unknown_as) for e in excerpts if e.expect != "unknown"))


def by_phase(runs: Sequence[JobRun]) -> dict[str, tuple[int, int, int, int]]:
    """Phase -> (transient, lost, persistent, restarts on persistent)."""
    table: dict[str, list[int]] = {}
    for run in runs:
        row = table.setdefault(run.excerpt.phase, [0, 0, 0, 0])
        if run.excerpt.expect == "retryable":
            row[0] += 1
            row[1] += run.lost
        else:
            row[2] += 1
            row[3] += run.restarts
    return {phase: (a, b, c, d) for phase, (a, b, c, d) in sorted(table.items())}
