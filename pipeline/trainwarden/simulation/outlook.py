"""What the engine would decide about one failure in each situation a running
job can be in, which its lines alone cannot show (``classify --explain``):
before any progress or after it, the first time or again at the same step,
and on the same node twice in a row. Each situation is played on a
VirtualCluster through ``engine.step``, so the answer is the engine's own,
never a second copy of its rules.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

from trainwarden.events import Decision, SdkOp
from trainwarden.evidence.phase import failure_phase
from trainwarden.rules.model import RulePack
from trainwarden.simulation.cluster import VirtualCluster, instance_specs

# Fault tolerance asked for, every other flag at its default.
ARGS = "--enable-job-restart=True"
SITUATIONS = (
    ("before_progress", "before any progress in its round"),
    ("before_progress_again", "the same again, still without progress"),
    ("after_progress", "after progress, the first time"),
    ("after_progress_again", "the same again at the same step"),
    ("same_node_again", "on the same node again, with progress between"),
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    situation: str
    words: str
    decisions: tuple[Decision, ...]

    def summary(self) -> str:
        if not self.decisions:
            return "(the job ended the first time)"
        return " + ".join(f"{d.kind.value} ({d.reason.value}, rule {d.rule})" for d in self.decisions)


def _fail(cluster: VirtualCluster, exit_code: int, lines: tuple[str, ...], instance: str = "worker-1") -> list:
    cluster.advance(cluster.now + 10)
    return cluster.exit(instance, exit_code, lines)


def _progress(cluster: VirtualCluster, step: int) -> None:
    cluster.advance(cluster.now + 5)
    cluster.sdk("worker-0", SdkOp.REPORT_PROGRESS, step=step)


def _settled(cluster: VirtualCluster, decisions: list) -> tuple[Decision, ...]:
    """The decisions on the failure, once the engine's windows (attribution, notice) are over."""
    for _ in range(3):
        if decisions or cluster.state.finished:
            break
        cluster.advance(cluster.now + 10)
        decisions = cluster.tick()
    return tuple(d for d in decisions if d.error_source is not None)


def outlook(pack: RulePack, exit_code: int, lines: Iterable[str], keywords: tuple[str, ...] = (),
            args: str = ARGS) -> tuple[str, list[Outcome]]:
    """The phase the lines show, and the engine's decisions in each situation."""
    lines = tuple(lines)
    outcomes = []
    for situation, words in SITUATIONS:
        cluster = VirtualCluster(pack, job_id="classify", args=args, instances=instance_specs([("worker", 2)]))
        if keywords:
            cluster.sdk("worker-1", SdkOp.SET_RETRYABLE_ERRORS, keywords=keywords)
        decided: Optional[tuple] = None
        progressed = situation.startswith(("after", "same_node"))
        for attempt in range(2):
            if progressed and (attempt == 0 or situation == "same_node_again"):
                _progress(cluster, 100 * (attempt + 1))
            decided = _settled(cluster, _fail(cluster, exit_code, lines))
            if cluster.state.finished or not situation.endswith("again"):
                break
        if situation.endswith("again") and attempt == 0:
            decided = ()  # the job was over after the first time: nothing to decide again
        outcomes.append(Outcome(situation, words, decided or ()))
    return failure_phase(lines), outcomes
