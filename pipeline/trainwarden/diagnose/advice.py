"""Hang-interval advice from collective watchdog timeouts (spec section 7).

A line such as
    Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2143, OpType=ALLREDUCE, ...,
    Timeout(ms)=600000) ran for 600535 milliseconds before timing out
shows the process group's timeout. The hang interval should sit below it, so
that stacks are taken before the communication library kills the job: the
advice is the timeout minus max(150 s, a sixth of it): 600 s -> 450 s,
1,800 s -> 1,500 s.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional

_WATCHDOG = re.compile(r"(?:Watchdog caught collective operation timeout|collective operation timeout)"
                       r".*?Timeout\(ms\)=(\d+)")
WATCHDOG_MARK = "Timeout(ms)="  # a substring test first: most lines are nowhere near this
MIN_MARGIN_S = 150
MIN_ADVICE_S = 60


@dataclasses.dataclass(frozen=True)
class Advice:
    timeout_s: float
    advised_s: int
    line: str

    def text(self) -> str:
        return (f"the collective timeout is {self.timeout_s:g} s; set --job-hang-interval={self.advised_s} so that "
                f"stacks are taken before the communication library ends the job")


def advised_interval(timeout_s: float) -> int:
    margin = max(MIN_MARGIN_S, timeout_s / 6)
    return max(MIN_ADVICE_S, int(timeout_s - margin))


def watchdog_timeout(line: str) -> Optional[float]:
    """The collective timeout in seconds named by this line, if it is a watchdog timeout."""
    if WATCHDOG_MARK not in line:
        return None
    match = _WATCHDOG.search(line)
    return int(match.group(1)) / 1000 if match else None


def advise(lines: Iterable[str]) -> Optional[Advice]:
    """Advice from the smallest watchdog timeout seen in these lines."""
    best: Optional[Advice] = None
    for line in lines:
        timeout = watchdog_timeout(line)
        if timeout is not None and (best is None or timeout < best.timeout_s):
            best = Advice(timeout, advised_interval(timeout), line.strip())
    return best
