"""Where a job's wall time went: goodput and badput by cause, for the report.

The convention is Google's ML goodput: goodput is the productive time over
the total (wall) time, and the rest is badput, broken down by its cause. The
history's stage timings give the time spent detecting, stopping, restarting
and starting; two causes need more than the stages, and are the ones a
plain "running over wall time" ratio hides:

- a hang's silence: the instances ran but did nothing for at least the hang
  interval before the hang was detected (the fault record says how long);
- lost work: what a round computed before a fault ended it. Trainwarden does
  not see the job's checkpoints, so a round that a fault ended counts as lost
  from its start-up to the fault: the most that can have been lost (a job
  that checkpoints lost only what followed its last checkpoint, and redid
  that). The last round of a failed job counts too: the job delivered nothing.

Pure: the caller reads the store.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

# What each figure of the breakdown means, shown beside it in the report.
MEANING = {
    "productive": "the instances ran and their work was kept",
    "lost work": "running time of rounds a fault ended, from start-up to the fault (at most: Trainwarden does not "
                 "see checkpoints; a job that checkpoints redid only what followed its last one)",
    "hang silence": "the instances were silent before a hang was detected (at least the hang interval)",
    "detecting": "from the fault's detection to the decision",
    "stopping": "stopping the round's instances",
    "restarting": "from stopped to the new round's instances started",
    "starting": "from started to the first line of every instance (start-up)",
    "queued": "a spot job waiting for capacity",
}
# The engine's "no output from any of the 2 running instances for at least 5 s
# (longest silence 5 s)": every instance was silent at least that long.
SILENCE = re.compile(r"\bfor (?:at least )?([0-9]+(?:\.[0-9]+)?) s\b")


@dataclasses.dataclass(frozen=True)
class Spent:
    cause: str
    seconds: float

    @property
    def meaning(self) -> str:
        return MEANING[self.cause]


@dataclasses.dataclass(frozen=True)
class RoundSpan:
    """One round: its start (its instances started), when the fault that ended
    it was detected (None: it did not end in a fault), its start-up seconds,
    and the silence of the hang that ended it (0: not a hang)."""

    start: float
    fault_at: Optional[float]
    startup_s: float = 0.0
    silence_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Goodput:
    wall_s: float
    spent: tuple[Spent, ...]  # productive first, then badput by cause

    @property
    def productive_s(self) -> float:
        return self.spent[0].seconds

    @property
    def fraction(self) -> Optional[float]:
        return None if self.wall_s <= 0 else self.productive_s / self.wall_s

    @property
    def badput(self) -> tuple[Spent, ...]:
        return self.spent[1:]


def hang_silence_s(message: str) -> float:
    """The silence a hang's fault record names (0 when it names none)."""
    found = SILENCE.search(message or "")
    return float(found.group(1)) if found else 0.0


def account(wall_s: float, stages: dict, rounds: Sequence[RoundSpan], spot: bool = False) -> Goodput:
    """``stages``: seconds detecting, stopping, restarting, starting, queued
    (report.with_spot_waits); ``rounds`` in order."""
    fixed = {cause: max(0.0, stages.get(f"{cause}_s") or 0.0)
             for cause in ("detecting", "stopping", "restarting", "starting", "queued")}
    silence = lost = 0.0
    for span in rounds:
        if span.fault_at is None:
            continue
        ran = max(0.0, span.fault_at - span.start - span.startup_s)
        silent = min(span.silence_s, ran)
        silence += silent
        lost += ran - silent
    # What is left of the wall time once every cause is counted is productive;
    # a budget that does not add up (clocks, rounding) never makes it negative.
    room = max(0.0, wall_s - sum(fixed.values()))
    silence = min(silence, room)
    lost = min(lost, room - silence)
    causes = ["lost work", "hang silence", "detecting", "stopping", "restarting", "starting"] + (
        ["queued"] if spot else [])
    amounts = {"lost work": lost, "hang silence": silence, **fixed}
    return Goodput(wall_s, (Spent("productive", room - silence - lost),) + tuple(Spent(c, amounts[c]) for c in causes))
