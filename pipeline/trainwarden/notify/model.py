"""Subscriptions as loaded: frozen, validated, with their origin (file:line).

Values that may hold secrets (URL, header values, the signing secret) are kept
as written, with ``${NAME}`` references unresolved: they are resolved per
request, in memory, and what is printed or logged is the written form.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
from typing import TYPE_CHECKING, Mapping, Optional

from trainwarden.notify.events import EVENT_TYPES, NotificationEvent, Severity
from trainwarden.notify.safety import env_names, redact_url, resolve

if TYPE_CHECKING:
    from trainwarden.notify.templates import BodyTemplate


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 12
    backoff_s: float = 2.0  # before the second attempt; doubles each time (with jitter)
    max_backoff_s: float = 300.0


@dataclasses.dataclass(frozen=True)
class JobLimit:
    """At most ``max_messages`` messages of one job per ``interval_s``,
    whatever their types, so that no job floods a receiver; 0 s: off."""

    max_messages: int = 20
    interval_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class Target:
    url: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 10.0
    allow_private_targets: bool = False

    def fingerprint(self) -> str:
        """Changes when the endpoint does: a subscription disabled by 410 Gone
        comes back by itself once its URL is edited."""
        return hashlib.sha256(f"{self.method} {self.url}".encode()).hexdigest()[:16]

    def shown_url(self) -> str:
        """For people and logs: references as written, literals redacted."""
        return self.url if env_names(self.url) else redact_url(self.url)


@dataclasses.dataclass(frozen=True, eq=False)
class Subscription:
    name: str
    target: Target
    template: "BodyTemplate"
    events: tuple[str, ...] = ("*",)
    jobs: tuple[str, ...] = ("*",)
    min_severity: Severity = Severity.INFO
    enabled: bool = True
    secret: str = ""  # "${NAME}" of a whsec_ secret, or "" for unsigned
    content_type: str = "application/json"
    rate_limit_s: float = 60.0  # at most one message per (subscription, job, type) per interval; 0: off
    retry: RetryPolicy = RetryPolicy()
    job_limit: JobLimit = JobLimit()
    origin: str = ""  # file:line

    def matches(self, event: NotificationEvent) -> bool:
        if not self.enabled:
            return False
        if Severity(event.severity).rank < self.min_severity.rank:
            return False
        return (any(fnmatch.fnmatchcase(event.type, glob) for glob in self.events)
                and any(fnmatch.fnmatchcase(event.job_id, glob) for glob in self.jobs))

    def event_types(self) -> list[str]:
        """The types this subscription can receive (filters by type and severity)."""
        return [t for t, sev in EVENT_TYPES.items()
                if sev.rank >= self.min_severity.rank and any(fnmatch.fnmatchcase(t, g) for g in self.events)]

    def env_vars(self) -> list[str]:
        names = env_names(self.target.url) + env_names(self.secret)
        for _, value in self.target.headers:
            names += env_names(value)
        return sorted(set(names))

    def resolved(self, env: Mapping[str, str]) -> "Resolved":
        """The request parts with secrets filled in; KeyError names a missing variable."""
        headers = []
        for name, value in self.target.headers:
            value = resolve(value, env)
            if "\r" in value or "\n" in value:
                raise ValueError(f"header '{name}' would contain a line break after substitution")
            try:
                value.encode("latin-1")
            except UnicodeEncodeError:
                raise ValueError(f"header '{name}' would contain characters HTTP headers cannot carry "
                                 "(only Latin-1) after substitution") from None
            headers.append((name, value))
        secret = resolve(self.secret, env) if self.secret else ""
        if secret and not secret.startswith("whsec_"):
            raise ValueError(f"the signing secret in {self.secret} must start with 'whsec_'")
        url = resolve(self.target.url, env)
        if not url.isascii():
            raise ValueError("the URL would not be ASCII after substitution: percent-encode it")
        secrets = [env[n] for n in self.env_vars() if n in env]
        return Resolved(url=url, headers=tuple(headers), secret=secret, secrets=tuple(secrets))


@dataclasses.dataclass(frozen=True)
class Resolved:
    url: str
    headers: tuple[tuple[str, str], ...]
    secret: str
    secrets: tuple[str, ...]  # every substituted value: masked in anything written down

    def __repr__(self) -> str:  # a stray debug print must not leak them
        return "Resolved(<redacted>)"


@dataclasses.dataclass(frozen=True)
class SubscriptionSet:
    subscriptions: tuple[Subscription, ...]
    files: tuple[str, ...]
    directory: str

    def get(self, name: str) -> Optional[Subscription]:
        return next((s for s in self.subscriptions if s.name == name), None)

    def __iter__(self):
        return iter(self.subscriptions)

    def __len__(self) -> int:
        return len(self.subscriptions)
