"""How much Trainwarden takes from what users and jobs hand it (job files,
rules and subscription directories, the arguments string, a submission on
the bus), and how much of a refused value an error quotes.

Each limit is checked before the work it bounds: a file's size before it is
read whole, its YAML values while they are built (a parse stops at the first
one past the limit), a string's length before it is split, a submission's
instances before a state is made for each. Far above what a person writes or
the shipped files use, so that only a generated or hostile input meets them.
docs/OPERATIONS.md (Input limits) lists them; keep the two in step.
"""

from __future__ import annotations

import dataclasses

KIB = 1024
MIB = 1024 * KIB


@dataclasses.dataclass(frozen=True)
class ReadLimit:
    """What one read (a job file; every file of a rules or subscriptions
    directory together) may hold."""

    what: str  # "a job file", "the rules"
    max_file_bytes: int  # one file
    max_bytes: int  # every file together
    max_values: int  # YAML values (mappings, lists, scalars) built from every file together
    max_files: int = 1


# A job file of the README is under 1 KiB and 50 values.
JOB_FILE = ReadLimit("a job file", 256 * KIB, 256 * KIB, 10_000)
# The shipped rules are 160 KiB and 3,000 values in 13 files, the lexical model's weights
# (one block scalar: one value) their largest part.
RULES = ReadLimit("the rules", 4 * MIB, 16 * MIB, 50_000, max_files=500)
# The shipped subscriptions are 3 files, 2 KiB and 110 values together.
SUBSCRIPTIONS = ReadLimit("the subscriptions", 1 * MIB, 4 * MIB, 20_000, max_files=200)

MAX_RULES = 2_000  # entries of every section of a pack together (the shipped pack has 161)
MAX_SUBSCRIPTIONS = 200  # each is rendered with a sample of every event type it receives when loaded (10 ms)
MAX_INSTANCES = 16_384  # of one job, every role together (Llama 3 trained on 16,384 GPUs)
MAX_ROLES = 5  # chief, master, worker, ps, evaluator (jobspec.ROLE_ORDER)
MAX_ARGS_CHARS = 4096  # the arguments string; every flag of the README's table fits in 600
MAX_ERRORS_SHOWN = 20  # of one report of mistakes; the rest are counted ("... and N more errors")
QUOTE_CHARS = 80  # of a refused value quoted in an error
# A dead letter (an input refused, kept for the history): its error and the
# refused value, wherever it was refused (run, the agents, the services).
DEAD_LETTER_ERROR_CHARS = 2_000
DEAD_LETTER_VALUE_CHARS = 16_000

WHERE = "docs/OPERATIONS.md (Input limits)"


def size(count: int) -> str:
    """Bytes for people: 256 KiB, 4 MiB, 3.2 MiB, 900 bytes."""
    for unit, name in ((MIB, "MiB"), (KIB, "KiB")):
        if count >= unit:
            value = count / unit
            return f"{value:.0f} {name}" if value == int(value) or value >= 100 else f"{value:.1f} {name}"
    return f"{count} bytes"


def cut(text: str, limit: int = QUOTE_CHARS) -> str:
    """At most ``limit`` characters of the text, "..." after it when cut (a
    name or a message in a sentence, without quotes)."""
    return text if len(text) <= limit else text[:limit] + "..."


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """The value as Python shows it (a string in quotes), cut after ``limit``
    characters with "..." when longer: an error names what was refused without
    echoing a megabyte of it. Never builds more than a bounded text, whatever
    the value's size (a list of a million items, a string of a gigabyte)."""
    if isinstance(value, str):  # whole characters in whole quotes: '...'...
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    text = _bounded_repr(value, limit + 1, depth=3)
    return text if len(text) <= limit else text[:limit] + "..."


def _bounded_repr(value: object, room: int, depth: int) -> str:
    if isinstance(value, str):
        return repr(value[:room])
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value[:room]))
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        opening, closing = ("{", "}") if isinstance(value, (dict, set, frozenset)) else \
            ("(", ")") if isinstance(value, tuple) else ("[", "]")
        if depth == 0:
            return f"{opening}...{closing}"
        parts: list[str] = []
        used = 0
        items = value.items() if isinstance(value, dict) else value
        for item in items:
            if used >= room:
                parts.append("...")
                break
            if isinstance(value, dict):
                key, val = item
                part = f"{_bounded_repr(key, room - used, depth - 1)}: {_bounded_repr(val, room - used, depth - 1)}"
            else:
                part = _bounded_repr(item, room - used, depth - 1)
            parts.append(part)
            used += len(part) + 2
        return opening + ", ".join(parts) + closing
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * room:
        return f"a number of more than {room} digits"
    text = repr(value)
    return text[:room]
