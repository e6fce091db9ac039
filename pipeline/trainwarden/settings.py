"""The job's arguments string (``--name=value ...``) parsed into JobSettings.

Strict: an unknown flag, a repeated flag, a value of the wrong kind or out of
range is a SettingsError whose message names the flag and what it accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from typing import Callable, Mapping

from trainwarden.limits import MAX_ARGS_CHARS, WHERE, cut, quote


class SettingsError(ValueError):
    """A bad arguments string; ``flag`` names the culprit."""

    def __init__(self, message: str, flag: str = "", hint: str = ""):
        super().__init__(message)
        self.flag = flag
        self.hint = hint


class ExecutionMode(str, enum.Enum):
    SYNC = "Sync"
    ASYNC = "Async"


class FaultTolerantPolicy(str, enum.Enum):
    ON_FAILURE = "OnFailure"
    EXIT_CODE_AND_ERROR_MSG = "ExitCodeAndErrorMsg"
    NEVER = "Never"


class C4DLogLevel(str, enum.Enum):
    INFO = "Info"
    WARNING = "Warning"
    ERROR = "Error"


C4D_ENV_DEFAULTS: Mapping[str, str] = {
    "C4D_HANG_TIMEOUT": "10000000",
    "C4D_HANG_TIMES": "18",
    "C4D_CONN_BW_CHECK_PERIOD": "10",
    "C4D_RUNTIME_LOG_LEVEL": "INFO",
    "C4D_ENABLE_STATS_OUTPUT": "FALSE",
}

_C4D_RUNTIME_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

# The longest interval we accept: 30 days. Longer is almost surely a typo
# (milliseconds given as seconds) and would make detection meaningless.
MAX_INTERVAL_S = 30 * 24 * 3600
MAX_RESTARTS = 100_000


@dataclasses.dataclass(frozen=True)
class JobSettings:
    job_execution_mode: ExecutionMode = ExecutionMode.SYNC
    enable_job_restart: bool = False
    max_num_of_job_restart: int = 3
    enable_job_hang_detection: bool = False
    job_hang_interval: int = 1800
    enable_c4d_hang_detection: bool = False
    enable_job_exit_hang_detection: bool = False
    job_exit_hang_interval: int = 600
    fault_tolerant_policy: FaultTolerantPolicy = FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    max_num_of_same_error: int = 10
    max_tolerated_failure_rate: float = -1.0
    # Restarts in a row that made no progress (engine/progress.py); -1: no limit.
    max_num_of_no_progress_restart: int = 3
    c4d_log_level: C4DLogLevel = C4DLogLevel.WARNING
    c4d_common_envs: tuple[tuple[str, str], ...] = ()

    def flag_value(self, flag: str):
        """The value of a flag by its command-line name (``job-hang-interval``)."""
        spec = FLAGS.get(flag)
        if spec is None:
            raise KeyError(flag)
        value = getattr(self, spec.field)
        return value.value if isinstance(value, enum.Enum) else value

    def c4d_env(self) -> dict[str, str]:
        env = dict(C4D_ENV_DEFAULTS)
        env.update(dict(self.c4d_common_envs))
        return env


# ------------------------------------------------------------ value kinds


def _bool(flag: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise SettingsError(f"--{flag} must be True or False, not {quote(raw)}.", flag)


def _choice(enum_cls: type[enum.Enum]) -> Callable[[str, str], enum.Enum]:
    def parse(flag: str, raw: str) -> enum.Enum:
        for member in enum_cls:
            if member.value.lower() == raw.lower():
                return member
        allowed = ", ".join(m.value for m in enum_cls)
        raise SettingsError(f"--{flag} must be one of {allowed}, not {quote(raw)}.", flag)

    return parse


# At most 18 digits: every limit is far smaller, and Python refuses to convert
# more than 4,300 (a ValueError that is no SettingsError).
_ASCII_INT = re.compile(r"^[+-]?[0-9]{1,18}$")
_ASCII_DECIMAL = re.compile(r"^[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})$")


def _int_range(low: int, high: int, *, allow_minus_one: bool = False) -> Callable[[str, str], int]:
    def parse(flag: str, raw: str) -> int:
        allowed = f"an integer from {low} to {high}" + (" or -1 (off)" if allow_minus_one else "")
        # Python's int() also reads other scripts' digits ("１２"); a flag is ASCII.
        if not _ASCII_INT.match(raw.strip()):
            raise SettingsError(f"--{flag} must be {allowed}, not {quote(raw)}.", flag)
        value = int(raw, 10)
        if allow_minus_one and value == -1:
            return value
        if not low <= value <= high:
            raise SettingsError(f"--{flag} must be {allowed}, not {value}.", flag)
        return value

    return parse


def _failure_rate(flag: str, raw: str) -> float:
    allowed = "a fraction from 0 to 1, or -1 to disable"
    if not _ASCII_DECIMAL.match(raw.strip()):
        raise SettingsError(f"--{flag} must be {allowed}, not {quote(raw)}.", flag)
    value = float(raw)
    if value == -1:
        return -1.0
    if not 0.0 <= value <= 1.0 or value != value:
        raise SettingsError(f"--{flag} must be {allowed}, not {raw}.", flag)
    return value


def _c4d_envs(flag: str, raw: str) -> tuple[tuple[str, str], ...]:
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        if "=" not in item:
            raise SettingsError(f"--{flag} takes K1=V1,K2=V2 pairs; {quote(item)} has no '='.", flag)
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in C4D_ENV_DEFAULTS:
            allowed = ", ".join(C4D_ENV_DEFAULTS)
            raise SettingsError(f"--{flag}: unknown variable {quote(key)}; allowed: {allowed}.", flag)
        if key in pairs:
            raise SettingsError(f"--{flag}: {key} is given twice.", flag)
        pairs[key] = _check_c4d_value(flag, key, value)
    return tuple(sorted(pairs.items()))


def _check_c4d_value(flag: str, key: str, value: str) -> str:
    if key in ("C4D_HANG_TIMEOUT", "C4D_HANG_TIMES", "C4D_CONN_BW_CHECK_PERIOD"):
        if not _ASCII_INT.match(value) or int(value) <= 0:
            raise SettingsError(f"--{flag}: {key} must be a positive integer, not {quote(value)}.", flag)
        return value
    if key == "C4D_RUNTIME_LOG_LEVEL":
        if value.upper() not in _C4D_RUNTIME_LEVELS:
            raise SettingsError(
                f"--{flag}: {key} must be one of {', '.join(_C4D_RUNTIME_LEVELS)}, not {quote(value)}.", flag
            )
        return value.upper()
    if value.upper() not in ("TRUE", "FALSE"):
        raise SettingsError(f"--{flag}: {key} must be TRUE or FALSE, not {quote(value)}.", flag)
    return value.upper()


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    name: str
    field: str
    parse: Callable[[str, str], object]
    meaning: str

    @property
    def kind(self) -> str:
        """bool, int, float or other: what rule files may use the flag for."""
        value = getattr(JobSettings(), self.field)
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, int):
            return "int"
        if isinstance(value, float):
            return "float"
        return "other"


def _flag(name: str, parse: Callable[[str, str], object], meaning: str) -> FlagSpec:
    return FlagSpec(name, name.replace("-", "_"), parse, meaning)


FLAGS: dict[str, FlagSpec] = {
    spec.name: spec
    for spec in (
        _flag("job-execution-mode", _choice(ExecutionMode),
              "Sync: a retryable fault restarts the whole job; Async: only the failed instance restarts"),
        _flag("enable-job-restart", _bool, "whether the job itself may be restarted"),
        _flag("max-num-of-job-restart", _int_range(0, MAX_RESTARTS), "most job restarts"),
        _flag("enable-job-hang-detection", _bool,
              "Sync only: restart when every instance is silent for the hang interval"),
        _flag("job-hang-interval", _int_range(1, MAX_INTERVAL_S), "seconds of silence that make a hang"),
        _flag("enable-c4d-hang-detection", _bool, "use C4D diagnosis to find the node behind a hang"),
        _flag("enable-job-exit-hang-detection", _bool,
              "Sync only: restart when the job has not finished within the interval after one instance exited"),
        _flag("job-exit-hang-interval", _int_range(1, MAX_INTERVAL_S), "seconds allowed for the exit"),
        _flag("fault-tolerant-policy", _choice(FaultTolerantPolicy),
              "OnFailure, ExitCodeAndErrorMsg (restart only retryable faults) or Never"),
        _flag("max-num-of-same-error", _int_range(1, MAX_RESTARTS),
              "most times the same error may occur on one instance"),
        _flag("max-num-of-no-progress-restart", _int_range(0, MAX_RESTARTS, allow_minus_one=True),
              "most restarts in a row after which the job got no further before failing again; -1 disables"),
        _flag("max-tolerated-failure-rate", _failure_rate,
              "fraction of workers that may fail before the job fails; -1 disables"),
        _flag("c4d-log-level", _choice(C4DLogLevel), "C4D levels shown: Info, Warning or Error"),
        _flag("c4d-common-envs", _c4d_envs, "C4D environment, K1=V1,K2=V2"),
    )
}


def parse_args_string(text: str) -> JobSettings:
    """Parse ``--name=value`` tokens into JobSettings; missing flags take defaults."""
    text = text or ""
    if len(text) > MAX_ARGS_CHARS:
        # Before the split: shlex takes seconds over a megabyte.
        raise SettingsError(f"The arguments string is {len(text):,} characters long; it may be at most "
                            f"{MAX_ARGS_CHARS:,} (it begins {quote(text)}).",
                            hint=f"every flag of the README's table fits in a few hundred characters; the limits are "
                                 f"listed in {WHERE}")
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise SettingsError(f"The arguments string cannot be split: {exc}.", hint="check the quotes") from None
    values: dict[str, object] = {}
    for token in tokens:
        if not token.startswith("--") or "=" not in token:
            raise SettingsError(
                f"{quote(token)} is not of the form --name=value.",
                cut(token),
                hint="write every flag as --name=value, e.g. --enable-job-restart=True",
            )
        name, raw = token[2:].split("=", 1)
        spec = FLAGS.get(name)
        if spec is None:
            raise SettingsError(
                f"Unknown flag --{cut(name)}.", cut(name), hint="known flags: " + ", ".join("--" + f for f in FLAGS)
            )
        if spec.field in values:
            raise SettingsError(f"--{name} is given more than once.", name)
        values[spec.field] = spec.parse(name, raw.strip())
    return JobSettings(**values)


def defaults_table() -> list[tuple[str, str, str]]:
    """(flag, default, meaning) rows for docs and ``--help``."""
    default = JobSettings()
    rows = []
    for name, spec in FLAGS.items():
        value = default.flag_value(name)
        if isinstance(value, bool):
            shown = "True" if value else "False"
        elif isinstance(value, float) and value.is_integer():
            shown = int(value)
        else:
            shown = value
        if name == "c4d-common-envs":
            shown = "(C4D defaults)"
        rows.append((f"--{name}", str(shown), spec.meaning))
    return rows
