"""Load a rules directory into a RulePack, strictly.

Files (``*.yaml``/``*.yml`` directly in the directory) are read in name order
and their lists concatenated. A rule whose name already exists is an error
unless it says ``replace: true``; ``enabled: false`` with ``replace: true``
switches a shipped rule off. Any error names the file and line, and nothing
is applied unless every file is valid. A mistake in one entry does not stop
the reading: every entry of every file is checked, and all the mistakes are
reported together (``ConfigErrors``), as promtool does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

from trainwarden.events import DecisionKind, ErrorSource, Reason
from trainwarden.rules.model import (
    Classifier,
    Counter,
    Detector,
    DiagnosisRule,
    DetectorKind,
    Limit,
    LimitKind,
    OperationalSettings,
    Origin,
    Response,
    ResponseMatch,
    Retryability,
    RulePack,
)
from trainwarden.evidence.facts import FACT_NAMES
from trainwarden.rules.decisions_file import decisions_setting
from trainwarden.rules.lexical_file import lexical_setting
from trainwarden.rules.patterns import PatternError, PatternIndex, compile_pattern
from trainwarden.evidence.traceback import Origin as FrameOrigin
from trainwarden.settings import FLAGS, ExecutionMode, FaultTolerantPolicy
from trainwarden.limits import MAX_ERRORS_SHOWN, MAX_RULES, RULES, WHERE, cut, quote
from trainwarden.yamlsrc import Allowance, ConfigError, ConfigErrors, Fields, LineDict, OverLimit, load_yaml_file

SECTIONS = ("classifiers", "responses", "detectors", "limits", "diagnoses")
DIAGNOSIS_KINDS = ("RankCommHang", "RankNonCommHang", "RankCommSlow", "RankNonCommSlow")
DIAGNOSIS_LEVELS = ("Error", "Warning", "Info")
RESPONSE_ACTIONS = (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE, DecisionKind.FAIL_JOB)
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
DEFAULT_TAIL_LINES = 500


def shipped_rules_dir() -> Path:
    """The rule pack that comes with Trainwarden (repository or wheel copy)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent.parent / "rules", here / "_shipped_rules"):
        if candidate.is_dir():
            return candidate
    raise ConfigError("the shipped rules directory is missing from this installation")


def rule_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError("not a directory of rule files", directory,
                          hint="pass --rules DIR with the YAML rule files")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ConfigError("no rule files (*.yaml) in this directory", directory)
    if len(files) > RULES.max_files:
        raise ConfigError(f"{len(files):,} rule files in this directory; the rules may be at most "
                          f"{RULES.max_files} files", directory, hint=f"the limits are listed in {WHERE}")
    return files


def load_rules(directory: str | Path | None = None) -> RulePack:
    directory = Path(directory) if directory is not None else shipped_rules_dir()
    return load_rule_files(rule_files(directory))


def load_rule_files(paths: Sequence[str | Path]) -> RulePack:
    """These files as one pack, read in the order given (a directory's are in
    name order), within the limits of ``limits.RULES`` and ``MAX_RULES``."""
    builder = _PackBuilder()
    for path in paths:
        if builder.over_limit:
            break  # the files after add nothing but more of the same mistake
        builder.add_file(Path(path))
    return builder.build()


class _PackBuilder:
    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        # Names of entries refused for a mistake: a later 'replace' of one is not a second mistake.
        self.refused: dict[str, set[str]] = {section: set() for section in SECTIONS}
        self.settings: dict[str, Any] = {}
        self.files: list[str] = []
        self.errors: list[ConfigError] = []
        self.more_errors = 0  # past the ones kept for the report: counted only
        self.allowance = Allowance(RULES)
        self.rules = 0
        self.over_limit = False

    def _checked(self, check: Callable[[], Any], default: Any = None) -> Any:
        """The check's result, or ``default`` with its mistake kept for the report."""
        try:
            return check()
        except ConfigError as exc:
            self._keep(getattr(exc, "errors", [exc]), getattr(exc, "more", 0))
            return default

    def _keep(self, errors: list[ConfigError], more: int = 0) -> None:
        room = MAX_ERRORS_SHOWN - len(self.errors)
        self.errors.extend(errors[:max(room, 0)])
        self.more_errors += more + max(len(errors) - max(room, 0), 0)

    def add_file(self, path: Path) -> None:
        def read():
            try:
                return load_yaml_file(path, self.allowance)
            except OverLimit:
                self.over_limit = True
                raise

        document = self._checked(read, ...)
        if document is ... or document is None:
            return
        top = self._checked(lambda: Fields(document, path, "a rule file"))
        if top is None:
            return
        version = self._checked(lambda: top.get("version", int, 1), 1)
        if version != 1:
            self._keep([top.error("version", f"unsupported rule file version {quote(version)}; this Trainwarden "
                                             "reads version 1")])
            return
        for section in SECTIONS:
            items = self._checked(lambda: top.get(section, list, []), [])
            self.rules += len(items)
            if self.rules > MAX_RULES:
                self._keep([top.error(section, f"more than {MAX_RULES:,} rules by this section; the rules may have at "
                                               f"most {MAX_RULES:,} in all their files together",
                                      hint=f"is it generated by mistake? The limits are listed in {WHERE}")])
                self.over_limit = True
                return
            parse = _PARSERS[section]
            for index, item in enumerate(items):
                self._checked(lambda: self._add(section, item, path, items.line_of(index), parse))
        settings = self._checked(lambda: top.get("settings", dict, None))
        if settings is not None:
            self._checked(lambda: self._settings(Fields(settings, path, "settings")))
        self._keep(top.unknown())
        self.files.append(str(path))

    def _add(self, section: str, item: Any, path: Path, line: int,
             parse: Callable[[Fields, Origin], Any]) -> None:
        fields = Fields(item, path, f"an entry of '{section}'", line)
        name = fields.get("name", str)
        if not NAME_RE.match(name):
            raise fields.error("name", f"rule name {quote(name)} must be lower-case letters, digits, '_', '.', '-'")
        replace = fields.get("replace", bool, False)
        enabled = fields.get("enabled", bool, True)
        existing = self.entries[section]
        if name in existing and not replace:
            raise fields.error("name", f"{section[:-1]} {quote(name)} is already defined at {existing[name][0]}",
                               hint="add 'replace: true' to override it")
        refused = self.refused[section]
        if replace and name not in existing:
            if name in refused:
                return  # the rule it replaces was refused already; that mistake is reported
            raise fields.error("replace", f"'replace: true' but no earlier {section[:-1]} is named {quote(name)}")
        origin = Origin(str(path), fields.line())
        if not enabled:
            extra = set(fields.mapping) - {"name", "replace", "enabled"}
            if extra:
                raise fields.error(sorted(extra)[0], "a disabled rule takes only 'name', 'replace' and 'enabled'")
            existing.pop(name, None)
            return
        try:
            rule = parse(fields, origin)
            fields.done()
        except ConfigError:
            refused.add(name)
            raise
        existing[name] = (origin, rule)

    def _settings(self, fields: Fields) -> None:
        tail = fields.get("tail_lines", int, None)
        if tail is not None:
            if not 10 <= tail <= 100_000:
                raise fields.error("tail_lines", "tail_lines must be from 10 to 100000")
            self.settings["tail_lines"] = tail
        priority = fields.get("custom_keyword_priority", int, None)
        if priority is not None:
            self.settings["custom_keyword_priority"] = _priority(fields, "custom_keyword_priority", priority)
        fallback = fields.get("fallback", dict, None)
        if fallback is not None:
            fb = Fields(fallback, fields.path, "settings.fallback")
            self.settings["fallback_verdict"] = _verdict(fb, "retryable")
            self.settings["fallback_category"] = fb.get("category", str)
            fb.done()
        unknown = fields.get("unknown", dict, None)
        if unknown is not None:
            un = Fields(unknown, fields.path, "settings.unknown")
            restarts = un.get("restarts", int)
            if not 0 <= restarts <= 100:
                raise un.error("restarts", "'restarts' must be from 0 to 100",
                               hint="how often the same unknown error is restarted before it fails the job")
            self.settings["unknown_restarts"] = restarts
            un.done()
        for name in ("attribution_window_s", "platform_notice_window_s"):
            window = fields.get(name, (int, float), None)
            if window is not None:
                if isinstance(window, bool) or not 0 <= window <= 600:
                    raise fields.error(name, f"{name} must be from 0 to 600 seconds")
                self.settings[name] = float(window)
        run_s = fields.get("progress_min_run_s", (int, float), None)
        if run_s is not None:
            if isinstance(run_s, bool) or not 1 <= run_s <= 30 * 24 * 3600:
                raise fields.error("progress_min_run_s", "progress_min_run_s must be from 1 to 2592000 seconds",
                                   hint="how long a round of a job that never reports its progress must run "
                                        "for its restart to count as progress")
            self.settings["progress_min_run_s"] = float(run_s)
        per_window = fields.get("custom_messages_per_window", int, None)
        if per_window is not None:
            if not 1 <= per_window <= 10_000:
                raise fields.error("custom_messages_per_window", "custom_messages_per_window must be from 1 to 10000",
                                   hint="how many custom messages of one job become history rows and "
                                        "notifications per window; the rest are counted")
            self.settings["custom_messages_per_window"] = per_window
        window_s = fields.get("custom_messages_window_s", (int, float), None)
        if window_s is not None:
            if isinstance(window_s, bool) or not 1 <= window_s <= 86_400:
                raise fields.error("custom_messages_window_s", "custom_messages_window_s must be from 1 to 86400 "
                                   "seconds")
            self.settings["custom_messages_window_s"] = float(window_s)
        lexical = fields.get("lexical", dict, None)
        if lexical is not None:
            self.settings["lexical"] = lexical_setting(Fields(lexical, fields.path, "settings.lexical",
                                                              fields.line("lexical")))
        decisions = fields.get("decisions", dict, None)
        if decisions is not None:
            self.settings["decisions"] = decisions_setting(
                Fields(decisions, fields.path, "settings.decisions", fields.line("decisions")),
                self.settings.get("decisions", OperationalSettings()))
        fields.done()

    def build(self) -> RulePack:
        if self.errors:
            raise ConfigErrors(self.errors, self.more_errors)

        def rules(section: str) -> tuple:
            return tuple(rule for _, rule in self.entries[section].values())

        classifiers = rules("classifiers")
        return RulePack(
            classifiers=classifiers,
            pattern_index=PatternIndex(classifiers),
            fallback_verdict=self.settings.get("fallback_verdict", Retryability.UNKNOWN),
            fallback_category=self.settings.get("fallback_category", "unknown"),
            responses=rules("responses"),
            detectors=rules("detectors"),
            limits=rules("limits"),
            diagnoses=rules("diagnoses"),
            tail_lines=self.settings.get("tail_lines", DEFAULT_TAIL_LINES),
            custom_keyword_priority=self.settings.get("custom_keyword_priority", 100),
            files=tuple(self.files),
            unknown_restarts=self.settings.get("unknown_restarts", 1),
            attribution_window_s=self.settings.get("attribution_window_s", 5.0),
            platform_notice_window_s=self.settings.get("platform_notice_window_s", 5.0),
            progress_min_run_s=self.settings.get("progress_min_run_s", 1800.0),
            lexical=self.settings.get("lexical"),
            custom_messages_per_window=self.settings.get("custom_messages_per_window", 30),
            custom_messages_window_s=self.settings.get("custom_messages_window_s", 60.0),
            decisions=self.settings.get("decisions", OperationalSettings()),
        )


# ------------------------------------------------------------ per section


def _priority(fields: Fields, key: str, value: int) -> int:
    if not 0 <= value <= 1000:
        raise fields.error(key, f"'{key}' must be from 0 to 1000")
    return value


def _enum(fields: Fields, key: str, enum_cls, allowed=None):
    raw = fields.get(key, str)
    members = allowed or tuple(enum_cls)
    for member in members:
        if member.value == raw:
            return member
    names = ", ".join(m.value for m in members)
    raise fields.error(key, f"'{key}' must be one of {names}, not {quote(raw)}")


def _string_list(fields: Fields, key: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    raw = fields.get(key, (list, str), [])
    items = [raw] if isinstance(raw, str) else raw
    result = []
    for item in items:
        if not isinstance(item, str):
            raise fields.error(key, f"'{key}' must list strings, not {quote(item)}")
        if allowed is not None and item not in allowed:
            raise fields.error(key, f"'{key}': {quote(item)} is not one of {', '.join(allowed)}")
        result.append(item)
    return tuple(result)


def _flag(fields: Fields, key: str, kinds: tuple[str, ...]) -> str:
    """A flag name whose value is of one of these kinds (bool, int, float)."""
    flag = fields.get(key, str)
    if flag not in FLAGS:
        raise fields.error(key, f"'{key}': unknown flag {quote(flag)}", hint="use a flag name without dashes in front, "
                           "e.g. job-hang-interval")
    kind = FLAGS[flag].kind
    if kind not in kinds:
        wanted = {"bool": "a True/False flag", "int": "an integer flag", "float": "a fraction flag"}
        allowed = [f for f, spec in FLAGS.items() if spec.kind in kinds]
        raise fields.error(key, f"'{key}' must name {' or '.join(wanted[k] for k in kinds)}; {quote(flag)} is not one",
                           hint="for example " + ", ".join(allowed[:4]))
    return flag


def _exit_codes(fields: Fields) -> tuple[tuple[int, int], ...]:
    raw = fields.get("exit_codes", list, [])
    ranges = []
    for item in raw:
        if isinstance(item, int) and not isinstance(item, bool):
            low = high = item
        elif isinstance(item, str) and re.fullmatch(r"\s*-?\d+\s*-\s*-?\d+\s*", item):
            low, high = (int(x) for x in re.match(r"\s*(-?\d+)\s*-\s*(-?\d+)", item).groups())
        else:
            raise fields.error("exit_codes", f"exit code {quote(item)} must be an integer or a range like \"128-255\"")
        if low > high or low < 0 or high > 255:
            raise fields.error("exit_codes", f"exit code range {quote(item)} must lie within 0-255, low to high",
                               hint="a death by signal N is exit code 128+N here (also when reported as -N), "
                                    "or use 'signals: [N]'")
        ranges.append((low, high))
    return tuple(ranges)


def _patterns(fields: Fields, key: str = "patterns") -> tuple:
    raw = fields.get(key, list, [])
    ignore_case = fields.get("ignore_case", bool, False)
    compiled = []
    for index, pattern in enumerate(raw):
        line = raw.line_of(index) if hasattr(raw, "line_of") else fields.line(key)
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"pattern {quote(pattern)} must be a non-empty string", fields.path, line)
        try:
            compiled.append(compile_pattern(pattern, ignore_case))
        except PatternError as exc:
            raise ConfigError(f"pattern {quote(pattern)} is not a valid regular expression: {cut(str(exc), 200)}",
                              fields.path, line) from None
    return tuple(compiled)


_EXCEPTION_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*$")


def _verdict(fields: Fields, key: str) -> Retryability:
    raw = fields.get(key, (bool, str))
    if raw is True:
        return Retryability.RETRYABLE
    if raw is False:
        return Retryability.NOT_RETRYABLE
    if raw == "unknown":
        return Retryability.UNKNOWN
    raise fields.error(key, f"'{key}' must be true, false or unknown, not {quote(raw)}")


def _signals(fields: Fields) -> tuple[int, ...]:
    raw = fields.get("signals", list, [])
    numbers = []
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 64:
            raise fields.error("signals", f"signal {quote(item)} must be a signal number from 1 to 64",
                               hint="for example 9 (SIGKILL) or 15 (SIGTERM)")
        numbers.append(item)
    return tuple(numbers)


def _classifier(fields: Fields, origin: Origin) -> Classifier:
    exit_codes = _exit_codes(fields)
    patterns = _patterns(fields)
    exceptions = _string_list(fields, "exceptions")
    for name in exceptions:
        if not _EXCEPTION_NAME.match(name):
            raise fields.error("exceptions", f"'exceptions': {quote(name)} is not an exception type name",
                               hint="for example KeyError or botocore.exceptions.ClientError")
    raised_in = _string_list(fields, "raised_in", tuple(o.value for o in FrameOrigin))
    signals = _signals(fields)
    facts = _string_list(fields, "facts", FACT_NAMES)
    if not (exit_codes or patterns or exceptions or raised_in or signals or facts):
        raise fields.error(None, "a classifier needs at least one of 'exit_codes', 'patterns', 'exceptions', "
                                 "'raised_in', 'signals' or 'facts'")
    return Classifier(
        name=fields.get("name", str),
        category=fields.get("category", str),
        verdict=_verdict(fields, "retryable"),
        exit_codes=exit_codes,
        patterns=patterns,
        priority=_priority(fields, "priority", fields.get("priority", int, 50)),
        description=fields.get("description", str, ""),
        origin=origin,
        signature=_one_of(fields, "signature", ("rule", "line"), "rule"),
        exceptions=exceptions,
        raised_in=raised_in,
        signals=signals,
        facts=facts,
        unless=_patterns(fields, "unless"),
        aftermath=fields.get("aftermath", bool, False),
        anywhere=fields.get("anywhere", bool, False),
    )


def _one_of(fields: Fields, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = fields.get(key, str, default)
    if value not in allowed:
        raise fields.error(key, f"'{key}' must be one of {', '.join(allowed)}, not {quote(value)}")
    return value


def _response(fields: Fields, origin: Origin) -> Response:
    when_raw = fields.get("when", dict, LineDict())
    when = Fields(when_raw, fields.path, "'when'", fields.line("when"))
    retryable = when.get("retryable", bool, None)
    match = ResponseMatch(
        policies=_string_list(when, "policy", tuple(p.value for p in FaultTolerantPolicy)),
        modes=_string_list(when, "mode", tuple(m.value for m in ExecutionMode)),
        roles=_string_list(when, "role"),
        retryable=retryable,
    )
    when.done()
    return Response(
        name=fields.get("name", str),
        when=match,
        action=_enum(fields, "action", DecisionKind, RESPONSE_ACTIONS),
        reason=_enum(fields, "reason", Reason),
        origin=origin,
    )


def _detector(fields: Fields, origin: Origin) -> Detector:
    return Detector(
        name=fields.get("name", str),
        kind=_enum(fields, "kind", DetectorKind),
        enabled_by=_flag(fields, "enabled_by", ("bool",)),
        modes=_string_list(fields, "modes", tuple(m.value for m in ExecutionMode)),
        interval_flag=_flag(fields, "interval_flag", ("int",)),
        error_source=_enum(fields, "error_source", ErrorSource),
        action=_enum(fields, "action", DecisionKind, (DecisionKind.RESTART_JOB, DecisionKind.FAIL_JOB)),
        reason=_enum(fields, "reason", Reason),
        origin=origin,
        startup_allowance_s=_allowance(fields),
    )


def _allowance(fields: Fields) -> int:
    value = fields.get("startup_allowance_s", int, 0)
    if not 0 <= value <= 86_400:
        raise fields.error("startup_allowance_s", "startup_allowance_s must be from 0 to 86400 seconds")
    return value


def _limit(fields: Fields, origin: Origin) -> Limit:
    kind = _enum(fields, "kind", LimitKind)
    applies = tuple(
        _enum_value(fields, "applies_to", DecisionKind, item, (DecisionKind.RESTART_JOB, DecisionKind.RESTART_INSTANCE))
        for item in _string_list(fields, "applies_to")
    )
    if not applies:
        raise fields.error("applies_to", "'applies_to' must list restart_job and/or restart_instance")
    counter = None
    if kind is LimitKind.FLAG_REQUIRED:
        flag = _flag(fields, "flag", ("bool",))
    else:
        counter = _enum(fields, "counter", Counter)
        flag = _flag(fields, "max_flag", ("float",) if kind is LimitKind.MAX_RATIO else ("int",))
        ratio = counter is Counter.FAILED_INSTANCE_RATIO
        if ratio != (kind is LimitKind.MAX_RATIO):
            raise fields.error("counter", f"counter {counter.value} does not fit kind {kind.value}",
                               hint="max_ratio goes with failed_instance_ratio; max_count with the others")
    return Limit(
        name=fields.get("name", str),
        kind=kind,
        applies_to=applies,
        flag=flag,
        counter=counter,
        roles=_string_list(fields, "roles"),
        reason=_enum(fields, "reason", Reason),
        origin=origin,
    )


def _enum_value(fields: Fields, key: str, enum_cls, raw: str, allowed) -> Any:
    for member in allowed:
        if member.value == raw:
            return member
    raise fields.error(key, f"'{key}': {quote(raw)} is not one of {', '.join(m.value for m in allowed)}")


def _diagnosis(fields: Fields, origin: Origin) -> DiagnosisRule:
    source = fields.get("source", str)
    if source != "c4d":
        raise fields.error("source", f"'source' must be c4d, not {quote(source)}")
    action_raw = fields.get("action", str, "none")
    allowed = {"restart_job": DecisionKind.RESTART_JOB, "notify": DecisionKind.NOTIFY, "none": None}
    if action_raw not in allowed:
        raise fields.error("action", f"'action' must be one of {', '.join(allowed)}, not {quote(action_raw)}")
    enabled_by = []
    for flag in _string_list(fields, "enabled_by"):
        if flag not in FLAGS or FLAGS[flag].kind != "bool":
            raise fields.error("enabled_by", f"'enabled_by': {quote(flag)} is not a True/False flag")
        enabled_by.append(flag)
    return DiagnosisRule(
        name=fields.get("name", str),
        source=source,
        levels=_string_list(fields, "levels", DIAGNOSIS_LEVELS),
        kinds=_string_list(fields, "kinds", DIAGNOSIS_KINDS),
        enabled_by=tuple(enabled_by),
        isolate_node=fields.get("isolate_node", bool, False),
        action=allowed[action_raw],
        reason=_enum(fields, "reason", Reason),
        origin=origin,
    )


_PARSERS: dict[str, Callable[[Fields, Origin], Any]] = {
    "classifiers": _classifier,
    "responses": _response,
    "detectors": _detector,
    "limits": _limit,
    "diagnoses": _diagnosis,
}
