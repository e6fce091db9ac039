"""The C++ runtime's account of an uncaught exception.

An exception nothing catches in C++ code (NCCL's watchdog, gloo's
transport, a CUDA extension) ends the process the same way each time:
"terminate called after throwing an instance of 'X'", "what(): <the
error>", then abort(), which the shell reports as "Aborted (core dumped)"
and Python's faulthandler as "Fatal Python error: Aborted". The abort is
how the exception ended the process, not a crash of its own: what the
exception says decides (a connection reset by a peer, a collective timeout),
and with nothing recognised there the signal (SIGABRT) still speaks.

Pure: lines in, the lines that tell of the failure out.
"""

from __future__ import annotations

import re
from typing import Sequence

from trainwarden.evidence.ranks import rank_of, strip_prefix

__all__ = ["without_abort_echo"]

_TERMINATE = "terminate called after throwing an instance of"
# bash: "line 1: 4711 Aborted (core dumped) python train.py"
_SHELL_ABORT = re.compile(r"(?:^|:\s+)\d+\s+Aborted\b")
# What abort() prints or has printed for it, and nothing longer: a line that
# says more than that is left to the catalogue.
_SHELL_ECHO_CAP = 300


def _is_abort_echo(text: str) -> bool:
    if len(text) > _SHELL_ECHO_CAP:
        return False
    if text.startswith(("Aborted", "Fatal Python error: Aborted", "*** SIGABRT", "*** Signal 6")):
        return True
    return _SHELL_ABORT.search(text) is not None


def without_abort_echo(lines: Sequence[str]) -> list[str]:
    """``lines`` less the abort echoes that follow an uncaught C++ exception
    of the same rank (the ranks of a shared tail are apart: one rank's
    exception does not explain another's crash)."""
    if not any(_TERMINATE in line for line in lines):
        return list(lines)  # the usual tail: no C++ exception, nothing to set apart
    thrown: set = set()
    kept = []
    for line in lines:
        text = strip_prefix(line)
        rank = rank_of(line)
        if _TERMINATE in text:
            thrown.add(rank)
        elif rank in thrown and _is_abort_echo(text):
            continue
        kept.append(line)
    return kept
