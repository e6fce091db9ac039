"""``trainwarden simulate``: a spot job against a market trace, on a virtual clock.

The same pure engine decides (``simulation/cluster.py`` plays the cluster):
nothing runs and nothing sleeps. The job is modelled by the work it needs
(seconds of running) and how often it checkpoints: a preemption or a
restart loses the work since the last checkpoint. Failures can be injected
from a file:

    failures:
      - {time: 1200, instance: worker-1, exit_code: 1, log: "RuntimeError: NCCL error"}

Hang detection is not simulated (the virtual job prints nothing).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional

from trainwarden.engine.spot import SPOT_STATES, accrue
from trainwarden.engine.state import InstanceStatus
from trainwarden.events import DecisionKind, SpotBid
from trainwarden.jobspec import JobDefinition
from trainwarden.rules.model import RulePack
from trainwarden.simulation.cluster import VirtualCluster
from trainwarden.spot.market import TraceMarket
from trainwarden.yamlsrc import Fields, LineList, load_yaml_file

MAX_LOG = 4000


@dataclasses.dataclass(frozen=True)
class Failure:
    time: float
    instance: str
    exit_code: int
    log: str = ""


@dataclasses.dataclass
class SimResult:
    job_id: str
    status: str  # succeeded, failed, queued (the trace ended first)
    reason: str
    completion_s: Optional[float]  # from submission; None if it never finished
    queued_s: float
    held_s: float
    preemptions: int
    resumes: int
    restarts: int
    paid: float
    on_demand: float
    states: list  # the spot states in order: queued, running, requeued, ...
    steps: list = dataclasses.field(default_factory=list)  # (second, decision kind, reason)

    @property
    def saving(self) -> float:
        return 1 - self.paid / self.on_demand if self.on_demand > 0 else 0.0

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["saving"] = round(self.saving, 4)
        return data


def load_failures(path: str | Path, instances: set[str]) -> tuple[Failure, ...]:
    path = Path(path)
    top = Fields(load_yaml_file(path), path, "a failure trace", known=("failures",))
    items = top.get("failures", list)
    found = []
    for index, item in enumerate(items):
        line = items.line_of(index) if isinstance(items, LineList) else 0
        fields = Fields(item, path, "a failure", line, known=("time", "instance", "exit_code", "log"))
        time_ = fields.get("time", (int, float))
        if time_ < 0:
            raise fields.error("time", f"'time' must be seconds from the job's submission, not {time_}")
        instance = fields.get("instance", str)
        if instance not in instances:
            raise fields.error("instance", f"the job has no instance {instance!r}",
                               hint=f"instances: {', '.join(sorted(instances))}")
        code = fields.get("exit_code", int)
        if not 1 <= code <= 255:
            raise fields.error("exit_code", f"'exit_code' of a failure must be from 1 to 255, not {code}")
        found.append(Failure(float(time_), instance, code, fields.get("log", str, "")[:MAX_LOG]))
    return tuple(sorted(found, key=lambda f: f.time))


def simulate(job: JobDefinition, pack: RulePack, market: TraceMarket, bids: tuple[SpotBid, ...],
             duration_s: float, checkpoint_s: float = 0.0, failures: tuple[Failure, ...] = ()) -> SimResult:
    """Run the job until it finishes or the trace (and failures) run out."""
    cluster = VirtualCluster(pack, job.job_id, job.args, job.instances(), framework=job.framework, spot=bids)
    points = sorted([(t, 0, None) for t in market.change_times()] + [(f.time, 1, f) for f in failures],
                    key=lambda p: (p[0], p[1]))
    work = 0.0  # seconds of work done (lost back to the last checkpoint on a stop)
    state = cluster.state

    def running() -> bool:
        return all(i.status is InstanceStatus.RUNNING for i in state.instances.values())

    def saved(done: float) -> float:
        return done if checkpoint_s <= 0 else math.floor(done / checkpoint_s + 1e-9) * checkpoint_s

    index = 0
    while not cluster.state.finished:
        state = cluster.state
        next_t = points[index][0] if index < len(points) else math.inf
        if running() and cluster.now + (duration_s - work) <= next_t:
            cluster.advance(cluster.now + (duration_s - work))
            work = duration_s
            for name in list(state.instances):
                if not cluster.state.finished:
                    cluster.exit(name, 0)
            break
        if next_t == math.inf:
            break  # queued (or stopped) when the trace ends
        if running():
            work += next_t - cluster.now
        cluster.advance(next_t)
        _, kind, failure = points[index]
        index += 1
        if kind == 0:
            decisions = cluster.market(market.offers(next_t))
        else:
            decisions = cluster.exit(failure.instance, failure.exit_code,
                                     tail=[failure.log] if failure.log else ())
        if any(d.kind in (DecisionKind.REQUEUE, DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE)
               for d in decisions):
            work = saved(work)
    return _result(cluster)


def _result(cluster: VirtualCluster) -> SimResult:
    state = cluster.state
    spot = state.spot
    if spot is not None and not state.finished:
        accrue(spot, cluster.now)  # bill up to the end of the trace
    steps = [(round(t.at, 3), t.decision.kind.value, t.decision.reason.value) for t in cluster.decisions
             if t.decision.kind in SPOT_STATES]
    states = [SPOT_STATES[t.decision.kind] for t in cluster.decisions if t.decision.cost is not None]
    status = state.status.value if state.finished else "queued" if spot and spot.phase.value == "queued" \
        else "running"
    return SimResult(
        job_id=state.job_id, status=status, reason=state.final_reason,
        completion_s=round(cluster.now, 3) if state.finished else None,
        queued_s=round(spot.queued_s, 3) if spot else 0.0, held_s=round(spot.held_s, 3) if spot else cluster.now,
        preemptions=spot.preemptions if spot else 0, resumes=spot.resumes if spot else 0,
        restarts=state.job_restarts, paid=round(spot.paid, 6) if spot else 0.0,
        on_demand=round(spot.on_demand, 6) if spot else 0.0, states=states, steps=steps)
