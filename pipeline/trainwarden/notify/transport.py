"""One HTTP attempt, signed per Standard Webhooks, and what it means.

- Signing: ``webhook-signature: v1,<base64 HMAC-SHA256(id.timestamp.body)>``
  keyed by the base64 part of a ``whsec_`` secret, recomputed per attempt (the
  timestamp is the attempt's, so receivers' 5-minute tolerance holds on retries).
- The host is resolved here, every address is checked (safety.py), and the
  connection goes to the checked address with the name kept for the Host
  header and TLS: a second resolution cannot swap in another address.
- The response body is read up to a bound and the connection closed; proxies
  from the environment are not used; redirects are not followed (a 3xx is a
  permanent failure: a webhook that moved needs its URL edited).
"""

from __future__ import annotations

import base64
import dataclasses
import email.utils
import hashlib
import hmac
import http.client
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from trainwarden.notify.safety import TargetRefused, check_addresses

if TYPE_CHECKING:
    from trainwarden.notify.model import Subscription

RESPONSE_LIMIT = 64 * 1024
MAX_RETRY_AFTER_S = 3600.0
USER_AGENT = "Trainwarden-Notifier/1"

Resolver = Callable[[str, int], list[str]]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret[len("whsec_"):] + "==") if secret.startswith("whsec_") else secret.encode()
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one attempt came to. ``outcome``: delivered, retry, dead or disabled."""

    outcome: str
    http_status: int = 0
    latency_ms: float = 0.0
    error: str = ""
    retry_after_s: Optional[float] = None
    body: bytes = b""


def send_once(sub: "Subscription", event_id: str, body: bytes, *, env: Mapping[str, str],
              allow_loopback: bool = False, resolver: Resolver = system_resolver, limit: int = RESPONSE_LIMIT,
              clock: Callable[[], float] = time.time) -> tuple[Attempt, tuple[str, ...]]:
    """One signed attempt to a subscription's target. Returns the attempt and
    the secret values used, which the caller must mask in anything it writes."""
    try:
        resolved = sub.resolved(env)
    except KeyError as exc:
        return Attempt("dead", error=f"environment variable {exc.args[0]} is not set"), ()
    except ValueError as exc:
        return Attempt("dead", error=str(exc)), ()
    stamp = int(time.time())  # the receiver's clock judges it: wall time, not a scheduling clock
    headers = [("Content-Type", sub.content_type), ("User-Agent", USER_AGENT), ("webhook-id", event_id),
               ("webhook-timestamp", str(stamp))]
    if resolved.secret:
        headers.append(("webhook-signature", sign(resolved.secret, event_id, stamp, body)))
    headers.extend(resolved.headers)
    result = attempt(sub.target.method, resolved.url, headers, body, timeout_s=sub.target.timeout_s,
                     allow_private=sub.target.allow_private_targets, allow_loopback=allow_loopback,
                     resolver=resolver, limit=limit, now=clock)
    secrets = resolved.secrets + ((resolved.url,) if resolved.url != sub.target.url else ())
    return result, secrets


def attempt(method: str, url: str, headers: list[tuple[str, str]], body: bytes, *, timeout_s: float,
            allow_private: bool, allow_loopback: bool, resolver: Resolver = system_resolver,
            limit: int = RESPONSE_LIMIT, now: Callable[[], float] = time.time) -> Attempt:
    started = time.monotonic()

    def took() -> float:
        return round((time.monotonic() - started) * 1000, 1)

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return Attempt("dead", error="the resolved URL is not an http(s) URL with a host")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return Attempt("dead", error="the URL's port is not valid")
    try:
        addresses = resolver(host, port)
    except (OSError, UnicodeError) as exc:
        return Attempt("retry", latency_ms=took(), error=f"cannot resolve {host}: {exc}")
    try:
        check_addresses(host, addresses, allow_private, allow_loopback)
    except TargetRefused as exc:
        return Attempt("dead", latency_ms=took(), error=str(exc))
    if not addresses:
        return Attempt("retry", latency_ms=took(), error=f"{host} resolved to no address")
    connection = _connection(parts.scheme, host, port, addresses[0], timeout_s)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The timeout bounds each read; this bounds the whole attempt, so a receiver
    # trickling its headers byte by byte cannot hold a delivery worker.
    budget_s = timeout_s * 2 + 1
    aborted = threading.Event()
    watchdog = threading.Timer(budget_s, _abort, (connection, aborted))
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            connection.request(method, path, body=body, headers=dict(headers))
            response = connection.getresponse()
        except (UnicodeError, ValueError) as exc:
            # http.client refuses a header or path it cannot encode; its message
            # quotes the value, which may hold a secret: name the kind only.
            return Attempt("dead", latency_ms=took(),
                           error=f"the request could not be encoded ({type(exc).__name__}): header values must be "
                                 "Latin-1 and the URL ASCII")
        status = response.status
        retry_after = parse_retry_after(response.getheader("Retry-After"), now())
        try:
            data = _read_bounded(response, limit, started + timeout_s * 2)
        except (OSError, http.client.HTTPException, ssl.SSLError):
            if not 200 <= status < 300:
                raise
            data = b""  # delivered: an unreadable answer body does not undo that
    except (TimeoutError, socket.timeout):
        return Attempt("retry", latency_ms=took(), error=f"timed out after {timeout_s:g} s")
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        # The flag, not the timer thread's liveness: that thread may still be
        # running the abort when the worker's read fails.
        if aborted.is_set():
            return Attempt("retry", latency_ms=took(), error=f"no complete answer within {budget_s:g} s")
        return Attempt("retry", latency_ms=took(), error=f"{type(exc).__name__}: {exc}")
    finally:
        watchdog.cancel()
        connection.close()
    return Attempt(classify(status), http_status=status, latency_ms=took(),
                   error="" if 200 <= status < 300 else _describe(status, data), retry_after_s=retry_after,
                   body=data)


def classify(status: int) -> str:
    if 200 <= status < 300:
        return "delivered"
    if status == 410:
        return "disabled"
    # 408 is the receiver saying our request took too long: a timeout, retried like one.
    if status in (408, 429) or status >= 500:
        return "retry"
    return "dead"


def parse_retry_after(value: Optional[str], now: float) -> Optional[float]:
    """Seconds to wait: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        if value.isascii() and value.isdigit():
            return min(float(value), MAX_RETRY_AFTER_S)
        moment = email.utils.parsedate_to_datetime(value)
        if moment is None:
            return None
        return min(max(moment.timestamp() - now, 0.0), MAX_RETRY_AFTER_S)
    except Exception:  # noqa: BLE001 - whatever a receiver sends here, it is only a hint
        return None


def backoff(attempts: int, base_s: float, ceiling_s: float, rng: random.Random,
            retry_after_s: Optional[float] = None) -> float:
    """Delay before the next attempt after ``attempts`` failed ones: exponential
    with equal jitter (half fixed, half random, so concurrent notifiers spread out
    but none retries immediately), never sooner than the receiver's Retry-After."""
    step = min(ceiling_s, base_s * (2 ** max(attempts - 1, 0)))
    delay = step / 2 + rng.uniform(0, step / 2)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return delay


def _connection(scheme: str, host: str, port: int, address: str, timeout_s: float) -> http.client.HTTPConnection:
    if scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def pinned(_address, timeout=timeout_s, source_address=None):
        # http.client connects through this hook; TLS still verifies ``host``.
        return socket.create_connection((address, port), timeout, source_address)

    connection._create_connection = pinned  # type: ignore[attr-defined]
    return connection


def _abort(connection: http.client.HTTPConnection, aborted: threading.Event) -> None:
    aborted.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the worker blocked in recv
        except OSError:
            pass


def _read_bounded(response: http.client.HTTPResponse, limit: int, deadline: float) -> bytes:
    """At most ``limit`` bytes, and no longer than the deadline: a receiver that
    trickles a large answer cannot hold a delivery worker."""
    chunks = []
    total = 0
    while total < limit and time.monotonic() < deadline:
        chunk = response.read1(min(16 * 1024, limit - total)) if hasattr(response, "read1") else response.read(
            limit - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _describe(status: int, body: bytes) -> str:
    # Long enough that masking a secret the receiver echoed happens before the
    # caller cuts the text (to 1,000): a cut first could leave half a secret.
    text = "".join(c if c.isprintable() else " " for c in body[:2000].decode("utf-8", errors="replace")).strip()
    reason = http.client.responses.get(status, "")
    return f"HTTP {status} {reason}".strip() + (f": {text}" if text else "")
