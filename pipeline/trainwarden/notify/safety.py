"""What a subscription may point at and what may be written down.

- Secrets live in the environment and are referenced as ``${NAME}``; inline
  literals that look like secrets are refused at validation time, so they
  never land in git. Resolved values exist only in memory while a request is
  built; anything written to a log or a record goes through ``redact``.
- Targets: cloud metadata and link-local addresses are always refused (they
  reach credentials of the machine the notifier runs on, and no receiver of
  alerts lives there), and so are multicast and reserved ones. Loopback (and
  the unspecified address, which reaches it) is refused unless the target
  says ``allow_private_targets: true`` (a receiver beside the notifier, put
  there on purpose) or the notifier was created with ``allow_loopback=True``
  (tests): a local admin endpoint is a dangerous target to reach by mistake.
  Private (RFC 1918, ULA) addresses are allowed: in-house alert gateways live
  there. The check is made on every address a name resolves to, at each
  attempt, and the connection goes to the address that was checked (no DNS
  rebinding).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
import urllib.parse
from typing import Iterable, Mapping, Optional

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ONLY_REF = re.compile(r"^\s*\$\{[A-Za-z_][A-Za-z0-9_]*\}\s*$")
# "Bearer ${TOKEN}", "token ${T}", or just "${T}".
_AUTH_FORM = re.compile(r"^\s*(?:[A-Za-z][A-Za-z0-9._-]*\s+)?\$\{[A-Za-z_][A-Za-z0-9_]*\}\s*$")

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                            "instance-data.ec2.internal"})
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack...
    "169.254.170.2",  # AWS ECS task credentials
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure WireServer
))
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))

SENSITIVE_HEADER_WORDS = ("auth", "token", "secret", "key", "password", "passwd", "signature", "cookie",
                          "session", "credential")
SENSITIVE_QUERY_WORDS = ("token", "secret", "key", "password", "passwd", "sig", "signature", "auth",
                         "credential", "access_token", "sign")
# Values that are secrets whatever the header is called.
_SECRET_PREFIXES = ("whsec_", "xoxb-", "xoxp-", "xoxa-", "xoxr-", "ghp_", "gho_", "ghs_", "github_pat_", "sk-",
                    "sk_live_", "rk_live_", "AKIA", "ASIA", "glpat-", "eyJ")
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_\-]{24,}")


class TargetRefused(ValueError):
    """A target this notifier will not send to; the message says why."""


def env_names(text: str) -> list[str]:
    return ENV_REF.findall(text)


def resolve(text: str, env: Mapping[str, str]) -> str:
    """Substitute every ``${NAME}``; a missing variable is a KeyError naming it."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in env:
            raise KeyError(name)
        return env[name]

    return ENV_REF.sub(value, text)


def looks_like_secret(text: str) -> bool:
    """Heuristic for inline literals: known token prefixes, or a long run of
    token characters mixing upper case, lower case and digits (a hex id or a
    UUID does not mix cases, so it passes)."""
    literal = ENV_REF.sub("", text)
    for word in re.split(r"[\s,;]+", literal):
        if any(word.startswith(p) for p in _SECRET_PREFIXES) and len(word) > 8:
            return True
        for run in _TOKENISH.findall(word):
            if re.search(r"[a-z]", run) and re.search(r"[A-Z]", run) and re.search(r"[0-9]", run):
                return True
    return False


def is_sensitive_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in ("authorization", "proxy-authorization") or any(w in lowered for w in SENSITIVE_HEADER_WORDS)


def header_problem(name: str, value: str) -> Optional[str]:
    """Why this header value may not be written inline, or None."""
    if name.lower() in ("authorization", "proxy-authorization"):
        if not _AUTH_FORM.match(value):
            return (f"header '{name}' must take its credentials from the environment, as "
                    f"'Bearer ${{TOKEN_VAR}}' or '${{VAR}}'; inline credentials are refused")
        return None
    if is_sensitive_header(name) and not _ONLY_REF.match(value):
        return f"header '{name}' looks sensitive: give its value as '${{ENV_VAR}}', not inline"
    if looks_like_secret(value):
        return f"header '{name}' has an inline value that looks like a secret: use an '${{ENV_VAR}}' reference"
    return None


def url_problem(url: str) -> Optional[str]:
    """Static checks of a URL as written (references unresolved)."""
    if ENV_REF.sub("", url).strip() == "" and env_names(url):
        return None  # the whole URL comes from the environment: checked when resolved
    if not url.isascii():
        return "the URL must be ASCII: percent-encode other characters (e.g. caf%C3%A9)"
    try:
        parts = urllib.parse.urlsplit(ENV_REF.sub("x", url))
        parts.port  # noqa: B018 - raises for a port that is not a number from 0 to 65535
        raw = urllib.parse.urlsplit(url)
    except ValueError as exc:
        return f"the URL is not valid: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"the URL must start with http:// or https://, not {url.split(':', 1)[0]!r}"
    if "@" in raw.netloc:
        userinfo = raw.netloc.rsplit("@", 1)[0]
        if ":" in userinfo and not _ONLY_REF.match(userinfo.split(":", 1)[1]):
            return "the URL has an inline password: give it as '${ENV_VAR}' or use an Authorization header"
    for key, value in urllib.parse.parse_qsl(raw.query, keep_blank_values=True):
        if any(w in key.lower() for w in SENSITIVE_QUERY_WORDS) and value and not _ONLY_REF.match(value):
            return f"the URL's query parameter '{key}' looks sensitive: give its value as '${{ENV_VAR}}'"
    if looks_like_secret(urllib.parse.unquote(raw.path)) or looks_like_secret(raw.query):
        return "the URL has an inline part that looks like a secret: give the URL (or that part) as '${ENV_VAR}'"
    return None


# Where the setting goes; the refusal of a loopback target says so, word for word.
ALLOW_SETTING = "allow_private_targets: true"
LOOPBACK_HINT = f"add '{ALLOW_SETTING}' to the subscription's 'target:' (beside its 'url') if it really should " \
                "receive notifications"
NEVER_HINT = "no setting allows it: metadata, link-local, multicast and reserved addresses are never webhook targets"


@dataclasses.dataclass(frozen=True)
class TargetProblem:
    """Why a target is refused, and whether ``allow_private_targets`` lifts it (loopback only)."""

    text: str
    loopback: bool = False

    @property
    def hint(self) -> str:
        return LOOPBACK_HINT if self.loopback else NEVER_HINT


def host_problem(host: str, allow_private: bool, allow_loopback: bool) -> Optional[TargetProblem]:
    """Checks of a host name or literal address, before any resolution."""
    name = host.strip("[]").rstrip(".").lower()
    if name in METADATA_HOSTS:
        return TargetProblem(f"{name} is a cloud metadata service")
    if not (allow_private or allow_loopback) and (name == "localhost" or name.endswith(".localhost")):
        return TargetProblem(f"{name} is the loopback interface", loopback=True)
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        if not re.fullmatch(r"[0-9a-fx.]+", name):
            return None
        try:  # the forms inet_aton still takes: 2852039166, 0xa9.254.169.254, 127.1
            address = ipaddress.ip_address(socket.inet_aton(name))
        except OSError:
            return None
    return address_problem(address, allow_private, allow_loopback)


def address_problem(address: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool,
                    allow_loopback: bool) -> Optional[TargetProblem]:
    if isinstance(address, ipaddress.IPv6Address):
        # ::ffff:169.254.169.254 and 6to4 2002:a9fe:a9fe:: reach 169.254.169.254
        address = address.ipv4_mapped or address.sixtofour or address
    if address in METADATA_ADDRESSES:
        return TargetProblem(f"{address} is a cloud metadata address")
    if any(address in net for net in LINK_LOCAL):
        return TargetProblem(f"{address} is link-local")
    if address.is_loopback or address.is_unspecified:
        if allow_private or allow_loopback:
            return None
        return TargetProblem(f"{address} is the loopback interface", loopback=True)
    if address.is_multicast or address.is_reserved:
        return TargetProblem(f"{address} is not a unicast address")
    return None


def check_addresses(host: str, addresses: Iterable[str], allow_private: bool, allow_loopback: bool) -> None:
    """Every address the name resolved to must pass: a name that mixes a
    public address with a metadata one is refused whole."""
    problem = host_problem(host, allow_private, allow_loopback)
    if problem:
        raise TargetRefused(_refusal(host, problem))
    for raw in addresses:
        problem = address_problem(ipaddress.ip_address(raw.split("%", 1)[0]), allow_private, allow_loopback)
        if problem:
            raise TargetRefused(_refusal(host, problem))


def _refusal(host: str, problem: TargetProblem) -> str:
    return f"target {host} refused: {problem.text}; {problem.hint}"


def redact_url(url: str) -> str:
    """The URL with its password, query values and long path tokens masked."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = (userinfo.split(":", 1)[0] + ":***@" if ":" in userinfo else "***@") + host
    query = "&".join(f"{k}=***" for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    path = _TOKENISH.sub("***", parts.path)
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, query, ""))


def redact(text: str, secrets: Iterable[str]) -> str:
    """Mask every known secret value (and its longer pieces) in free text,
    e.g. an error message that echoes a URL."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
