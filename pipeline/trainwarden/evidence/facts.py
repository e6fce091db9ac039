"""Named facts a classifier can ask for (``facts:`` in the catalogue):
evidence that needs more than one line, each a pure function of the tail
that returns the line showing it, or None."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from trainwarden.evidence.collectives import collective_desync, collective_timeout_one_element, store_barrier_overcount
from trainwarden.evidence.memory import cuda_memory_held_elsewhere

FACTS: dict[str, Callable[[Sequence[str]], Optional[str]]] = {
    "collective_desync": collective_desync,
    "store_barrier_overcount": store_barrier_overcount,
    "cuda_memory_held_elsewhere": cuda_memory_held_elsewhere,
    "collective_timeout_one_element": collective_timeout_one_element,
}
FACT_NAMES = tuple(FACTS)
