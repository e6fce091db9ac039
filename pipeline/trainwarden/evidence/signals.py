"""A death by signal, in every spelling it comes in.

Shells and containers report signal N as exit code 128+N; Python's
``subprocess`` and torchelastic as -N. The text says it too: torchrun's
``Signal 9 (SIGKILL) received by PID``, a DataLoader's ``killed by signal:
Bus error``, the shell's ``Killed`` (often glued to the end of a progress-bar
line), the kernel's OOM-killer lines as ``dmesg`` prints them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

from trainwarden.evidence.ranks import strip_prefix

SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
                9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM",
                15: "SIGTERM"}
_BY_NAME = {name: number for number, name in SIGNAL_NAMES.items()}
_TEXT_FORMS = (
    re.compile(r"Signal (?P<n>\d+) \((?P<name>SIG[A-Z]+)\) received by PID"),
    re.compile(r"exitcode\s*:\s*-(?P<n>\d+)\b"),
    re.compile(r"(?:died|exited|terminated|killed) (?:with|by) (?:signal )?(?:<Signals\.)?(?P<name>SIG[A-Z]+)"),
    re.compile(r"(?:received|got|caught) (?:signal )?(?P<name>SIG(?:TERM|KILL|INT|HUP|USR1))\b"),
    re.compile(r"exit(?:ed)? (?:with |on )?signal[ :]+(?P<n>\d+)\b", re.IGNORECASE),
    re.compile(r"(?:return code|returncode|exit status|exit code)[ =:]+-(?P<n>\d{1,2})\b", re.IGNORECASE),
)
# The shell's report of a SIGKILLed child: "Killed" alone, or glued to the end
# of a progress bar that had no newline ("... 3.2it/s]Killed").
_KILLED = re.compile(r"(?:^|[\]\s%|])Killed(?:\s+\S*python\S*.*)?\s*$")
@dataclasses.dataclass(frozen=True)
class SignalDeath:
    signal: int
    how: str  # "exit code 137", "exit code -9", or the line that said so

    @property
    def name(self) -> str:
        return SIGNAL_NAMES.get(self.signal, f"signal {self.signal}")


def signal_of_exit(exit_code: int) -> Optional[int]:
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 160:
        return exit_code - 128
    return None


def canonical_exit_code(exit_code: int) -> int:
    """-N (Python, torchelastic) as the 128+N of shells and containers."""
    return 128 - exit_code if -64 <= exit_code < 0 else exit_code


def signal_death(exit_code: int, tail: Sequence[str]) -> Optional[SignalDeath]:
    """The signal that ended the process: from the exit code, else from the
    text of its last lines (a launcher's exit code is often 1)."""
    number = signal_of_exit(exit_code)
    if number is not None:
        return SignalDeath(number, f"exit code {exit_code}")
    for line in reversed(tail[-40:]):
        text = strip_prefix(line)
        for form in _TEXT_FORMS:
            match = form.search(text)
            if match is None:
                continue
            groups = match.groupdict()
            if groups.get("n"):
                return SignalDeath(int(groups["n"]), text)
            if groups.get("name") in _BY_NAME:
                return SignalDeath(_BY_NAME[groups["name"]], text)
        if _KILLED.search(text):
            return SignalDeath(9, text)
    return None
