"""What refusing an input costs, measured in a process of its own: the CPU
seconds (resource.getrusage) and the peak of traced memory (tracemalloc) of
the one call that reads it, and what that call raised. CPU time rather than
the wall clock: the bound must hold on a loaded machine too."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

_MEASURE = """\
import json, resource, sys, tracemalloc
{setup}
def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
tracemalloc.start()
started = _cpu()
try:
{call}
    raised, message, hint = "", "", ""
except Exception as exc:
    raised, message, hint = type(exc).__name__, str(exc), getattr(exc, "hint", "")
cpu_s = _cpu() - started
peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
print(json.dumps({{"cpu_s": cpu_s, "peak_mb": peak_mb, "raised": raised, "message": message, "hint": hint}}))
"""


@dataclasses.dataclass(frozen=True)
class Cost:
    cpu_s: float
    peak_mb: float
    raised: str  # the exception's type name, "" when the call returned
    message: str
    hint: str


def refusal_cost(call: str, setup: str = "", timeout_s: float = 600) -> Cost:
    """Run ``setup`` (imports, not measured), then measure ``call`` (statements)."""
    code = _MEASURE.format(setup=textwrap.dedent(setup), call=textwrap.indent(textwrap.dedent(call), "    "))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "pipeline"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Cost(**json.loads(proc.stdout.strip().splitlines()[-1]))
