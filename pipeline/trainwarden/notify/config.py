"""Load a directory of subscription files strictly.

Files (``*.yaml``/``*.yml`` directly in the directory) are read in name
order. Unknown keys, bad values, inline secrets, refused targets and template
errors are ConfigErrors naming the file and line, and nothing is used unless
every file is valid. Templates are looked up in the directory's
``templates/`` and then in the shipped ``rules/notifications/templates/``.
"""

from __future__ import annotations

import fnmatch
import re
import urllib.parse
from pathlib import Path
from typing import Mapping, Optional

from trainwarden.notify.events import EVENT_TYPES, Severity
from trainwarden.notify.model import JobLimit, RetryPolicy, Subscription, SubscriptionSet, Target
from trainwarden.notify.safety import ENV_REF, env_names, header_problem, host_problem, url_problem
from trainwarden.notify.templates import TemplateSet, check_template
from trainwarden.yamlsrc import ConfigError, Fields, LineDict, load_yaml_file

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
METHODS = ("POST", "PUT", "PATCH")
# Set by the notifier itself; a subscription header must not fake or break them.
RESERVED_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature", "content-length", "content-type",
                    "host", "transfer-encoding", "connection")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_ONLY_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")


def shipped_notifications_dir() -> Path:
    from trainwarden.rules.loader import shipped_rules_dir

    return shipped_rules_dir() / "notifications"


def subscription_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError("not a directory of subscription files", directory,
                          hint="pass a directory with *.yaml subscription files")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ConfigError("no subscription files (*.yaml) in this directory", directory)
    return files


def load_subscriptions(directory: str | Path | None = None, *, allow_loopback: bool = False) -> SubscriptionSet:
    """``allow_loopback`` lets literal loopback targets pass (tests, and the
    notifier created with the same flag); see pipeline/trainwarden/notify/safety.py."""
    directory = Path(directory) if directory is not None else shipped_notifications_dir()
    templates = TemplateSet([directory / "templates", shipped_notifications_dir() / "templates"])
    loader = _Loader(templates, allow_loopback)
    files = subscription_files(directory)
    for path in files:
        loader.add_file(path)
    return SubscriptionSet(tuple(loader.subscriptions), tuple(str(p) for p in files), str(directory))


def missing_env(subscriptions: SubscriptionSet, env: Mapping[str, str], enabled_only: bool = True) -> list[tuple]:
    """(subscription, variable) pairs that the environment does not provide."""
    return [(s, name) for s in subscriptions if s.enabled or not enabled_only
            for name in s.env_vars() if name not in env]


class _Loader:
    def __init__(self, templates: TemplateSet, allow_loopback: bool):
        self.templates = templates
        self.allow_loopback = allow_loopback
        self.subscriptions: list[Subscription] = []
        self.origins: dict[str, str] = {}

    def add_file(self, path: Path) -> None:
        document = load_yaml_file(path)
        if document is None:
            return
        top = Fields(document, path, "a subscription file")
        version = top.get("version", int, 1)
        if version != 1:
            raise top.error("version", f"unsupported subscription file version {version}; this Trainwarden "
                                       "reads version 1")
        items = top.get("subscriptions", list)
        top.done()
        lines = path.read_text(encoding="utf-8").splitlines()
        for index, item in enumerate(items):
            fields = Fields(item, path, "a subscription", items.line_of(index))
            self.subscriptions.append(self._subscription(fields, lines))

    def _subscription(self, fields: Fields, lines: list[str]) -> Subscription:
        name = fields.get("name", str)
        if not NAME_RE.match(name):
            raise fields.error("name", f"subscription name {name!r} must be lower-case letters, digits, "
                                       "'_', '.', '-'")
        if name in self.origins:
            raise fields.error("name", f"subscription '{name}' is already defined at {self.origins[name]}")
        origin = f"{fields.path}:{fields.line()}"
        target = self._target(Fields(fields.get("target", dict), fields.path, "'target'", fields.line("target")))
        subscription = Subscription(
            name=name,
            enabled=fields.get("enabled", bool, True),
            events=_globs(fields, "events", known=tuple(EVENT_TYPES)),
            jobs=_globs(fields, "jobs"),
            min_severity=_severity(fields),
            target=target,
            secret=_secret(fields),
            content_type=_content_type(fields),
            rate_limit_s=_rate_limit(fields),
            job_limit=_job_limit(fields),
            retry=_retry(fields),
            template=self._template(fields, name, lines),
            origin=origin,
        )
        fields.done()
        types = subscription.event_types()
        if not types:
            raise fields.error("events", f"subscription '{name}' can receive no event: no type of "
                                         f"{list(subscription.events)} has severity {subscription.min_severity.value}"
                                         " or higher")
        check_template(subscription.template, name, types, subscription.content_type)
        self.origins[name] = origin
        return subscription

    def _target(self, fields: Fields) -> Target:
        url = fields.get("url", str)
        problem = url_problem(url)
        if problem:
            raise fields.error("url", problem)
        allow_private = fields.get("allow_private_targets", bool, False)
        host = _literal_host(url)
        if host:
            problem = host_problem(host, allow_private, self.allow_loopback)
            if problem:
                raise fields.error("url", f"target refused: {problem}",
                                   hint="set 'allow_private_targets: true' if it really should receive them")
        method = fields.get("method", str, "POST")
        if method.upper() not in METHODS:
            raise fields.error("method", f"'method' must be one of {', '.join(METHODS)}, not {method!r}")
        timeout = fields.get("timeout_s", (int, float), 10.0)
        if not 0.05 <= timeout <= 300:
            raise fields.error("timeout_s", "'timeout_s' must be from 0.05 to 300 seconds")
        target = Target(url=url, method=method.upper(), headers=_headers(fields), timeout_s=float(timeout),
                        allow_private_targets=allow_private)
        fields.done()
        return target

    def _template(self, fields: Fields, name: str, lines: list[str]):
        chosen = fields.get("template", str, None)
        body = fields.get("body", str, None)
        if chosen is not None and body is not None:
            raise fields.error("body", "give 'template' or 'body', not both")
        if body is not None:
            line = fields.line("body")
            # In a block scalar (``body: |``) the template starts on the next line.
            rest = lines[line - 1].split(":", 1)[1].strip() if 0 < line <= len(lines) and ":" in lines[line - 1] else ""
            first = line + 1 if rest[:1] in ("|", ">") else line
            return self.templates.inline_template(name, body, str(fields.path), first)
        chosen = chosen or "json"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", chosen) or ".." in chosen:
            raise fields.error("template", f"'template' must name a template file without its .j2 suffix, "
                                           f"not {chosen!r}")
        return self.templates.file_template(chosen, (str(fields.path), fields.line("template")))


def _literal_host(url: str) -> Optional[str]:
    """The host as written, when no environment reference takes part in it."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or ENV_REF.search(parts.netloc) or (not parts.netloc and env_names(url)):
        return None
    try:
        return parts.hostname
    except ValueError:
        return None


def _globs(fields: Fields, key: str, known: tuple[str, ...] = ()) -> tuple[str, ...]:
    raw = fields.get(key, (list, str), ["*"])
    items = [raw] if isinstance(raw, str) else raw
    if not items:
        raise fields.error(key, f"'{key}' must list at least one pattern (use '*' for all)")
    for item in items:
        if not isinstance(item, str) or not item:
            raise fields.error(key, f"'{key}' must list non-empty strings, not {item!r}")
        if known and not any(fnmatch.fnmatchcase(t, item) for t in known):
            raise fields.error(key, f"'{key}': {item!r} matches no event type",
                               hint="event types: " + ", ".join(known))
    return tuple(items)


def _severity(fields: Fields) -> Severity:
    raw = fields.get("min_severity", str, "info")
    for member in Severity:
        if member.value == raw:
            return member
    raise fields.error("min_severity", f"'min_severity' must be one of "
                                       f"{', '.join(s.value for s in Severity)}, not {raw!r}")


def _secret(fields: Fields) -> str:
    secret = fields.get("secret", str, "")
    if secret and not _ONLY_REF.match(secret.strip()):
        raise fields.error("secret", "'secret' must be an environment reference such as '${TW_WEBHOOK_SECRET}' "
                                     "(holding a whsec_... secret); inline secrets are refused")
    return secret.strip()


def _content_type(fields: Fields) -> str:
    value = fields.get("content_type", str, "application/json")
    if not re.fullmatch(r"[\w.+-]+/[\w.+-]+(\s*;\s*[\w-]+=[\w.-]+)*", value):
        raise fields.error("content_type", f"'content_type' {value!r} is not a media type like application/json")
    return value


def _headers(fields: Fields) -> tuple[tuple[str, str], ...]:
    raw = fields.get("headers", dict, LineDict())
    result = []
    for name, value in raw.items():
        line = raw.line_of(name) if isinstance(raw, LineDict) else fields.line("headers")
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ConfigError(f"header name {name!r} is not a valid HTTP header name", fields.path, line)
        if name.lower() in RESERVED_HEADERS:
            hint = "set 'content_type' on the subscription instead" if name.lower() == "content-type" else ""
            raise ConfigError(f"header '{name}' is set by the notifier itself", fields.path, line, hint)
        if not isinstance(value, str):
            raise ConfigError(f"header '{name}' must be a string, not {value!r}", fields.path, line)
        if "\r" in value or "\n" in value:
            raise ConfigError(f"header '{name}' must not contain a line break", fields.path, line)
        problem = header_problem(name, value)
        if problem:
            raise ConfigError(problem, fields.path, line)
        result.append((name, value))
    return tuple(result)


def _rate_limit(fields: Fields) -> float:
    raw = fields.get("rate_limit", dict, None)
    if raw is None:
        return 60.0
    sub = Fields(raw, fields.path, "'rate_limit'", fields.line("rate_limit"))
    interval = sub.get("interval_s", (int, float))
    if not 0 <= interval <= 86_400:
        raise sub.error("interval_s", "'interval_s' must be from 0 (no limit) to 86400 seconds")
    sub.done()
    return float(interval)


def _job_limit(fields: Fields) -> JobLimit:
    raw = fields.get("job_limit", dict, None)
    if raw is None:
        return JobLimit()
    sub = Fields(raw, fields.path, "'job_limit'", fields.line("job_limit"))
    default = JobLimit()
    most = sub.get("max_messages", int, default.max_messages)
    interval = sub.get("interval_s", (int, float), default.interval_s)
    sub.done()
    if not 1 <= most <= 10_000:
        raise sub.error("max_messages", "'max_messages' must be from 1 to 10000")
    if not 0 <= interval <= 86_400:
        raise sub.error("interval_s", "'interval_s' must be from 0 (no limit) to 86400 seconds")
    return JobLimit(max_messages=most, interval_s=float(interval))


def _retry(fields: Fields) -> RetryPolicy:
    raw = fields.get("retry", dict, None)
    if raw is None:
        return RetryPolicy()
    sub = Fields(raw, fields.path, "'retry'", fields.line("retry"))
    default = RetryPolicy()
    attempts = sub.get("max_attempts", int, default.max_attempts)
    backoff = sub.get("backoff_s", (int, float), default.backoff_s)
    ceiling = sub.get("max_backoff_s", (int, float), max(default.max_backoff_s, backoff))
    sub.done()
    if not 1 <= attempts <= 100:
        raise sub.error("max_attempts", "'max_attempts' must be from 1 to 100")
    if not 0.01 <= backoff <= 3600:
        raise sub.error("backoff_s", "'backoff_s' must be from 0.01 to 3600 seconds")
    if not backoff <= ceiling <= 86_400:
        raise sub.error("max_backoff_s", "'max_backoff_s' must be at least 'backoff_s' and at most 86400 seconds")
    return RetryPolicy(max_attempts=attempts, backoff_s=float(backoff), max_backoff_s=float(ceiling))
