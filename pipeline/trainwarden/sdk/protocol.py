"""The SDK's wire protocol, shared by the client (job_monitor) and the servers.

One JSON object per line over the Unix socket named by
``TRAINWARDEN_SDK_SOCKET``, answered by one JSON object per line. A request
names no one: the server attributes it to the incarnation whose process tree
the connecting process belongs to (its kernel-reported pid), so nothing a
process can read or copy (an environment, a token) speaks for another
instance, and the job's own stdout can never speak for the SDK.

Version 2 (version 1 carried a token from the environment, which any process
of the same user could read from /proc; it is refused):

Request:  {"v": 2, "op": "custom_message", "content": "..."}
          {"v": 2, "op": "set_retryable_errors", "errors": ["..."]}
          {"v": 2, "op": "set_hang_interval", "interval": 180 | -1 | null}
          {"v": 2, "op": "report_progress", "step": 1200}
Response: {"ok": true, "detail": "..."} or {"ok": false, "error": "..."}

Only the standard library: this module is imported inside training code.
"""

from __future__ import annotations

import json

VERSION = 2
MAX_REQUEST_BYTES = 64 * 1024
MAX_CONTENT_CHARS = 16 * 1024
MAX_KEYWORDS = 100
MAX_KEYWORD_CHARS = 256
MAX_INTERVAL_S = 30 * 24 * 3600
# JSON numbers past 2**53 are not exact in every reader.
MAX_STEP = 2**53

# Each op and the one field it carries besides "v" and "op".
OP_FIELDS = {"custom_message": "content", "set_retryable_errors": "errors", "set_hang_interval": "interval",
             "report_progress": "step"}
OPS = tuple(OP_FIELDS)
# reset_config / Config(**params) accept these names; both set the calling
# instance's hang interval.
CONFIG_PARAMS = ("job_hang_interval", "enable_job_hang_detection")


class ProtocolError(ValueError):
    pass


def check_interval(value: object) -> int | None:
    """A hang interval from user code: positive seconds, -1 (off) or None (the job's)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"a hang interval must be an integer number of seconds or -1, not {value!r}")
    if value == -1 or 1 <= value <= MAX_INTERVAL_S:
        return value
    raise ProtocolError(f"a hang interval must be from 1 to {MAX_INTERVAL_S} seconds or -1 (off), not {value}")


def check_step(value: object) -> int:
    """A progress step from user code: an integer from 0 to MAX_STEP."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"a progress step must be an integer, not {value!r}")
    if 0 <= value <= MAX_STEP:
        return value
    raise ProtocolError(f"a progress step must be from 0 to {MAX_STEP}, not {value}")


def interval_from_config(params: dict) -> tuple[bool, int | None]:
    """(present, interval) for reset_config parameters; raises on unknown names."""
    unknown = [name for name in params if name not in CONFIG_PARAMS]
    if unknown:
        raise ProtocolError(f"unknown parameter {unknown[0]!r}; allowed: {', '.join(CONFIG_PARAMS)}")
    present = False
    interval: int | None = None
    if "job_hang_interval" in params:
        present, interval = True, check_interval(params["job_hang_interval"])
    if "enable_job_hang_detection" in params:
        enabled = params["enable_job_hang_detection"]
        if not isinstance(enabled, bool):
            raise ProtocolError("enable_job_hang_detection must be True or False")
        if not enabled:
            present, interval = True, -1
        elif not present:
            present, interval = True, None
    return present, interval


def encode_request(op: str, **fields: object) -> bytes:
    body = {"v": VERSION, "op": op, **fields}
    data = (json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    if len(data) > MAX_REQUEST_BYTES:
        raise ProtocolError(f"the request is {len(data)} bytes; the most is {MAX_REQUEST_BYTES}")
    return data


def decode_request(line: bytes) -> dict:
    """Parse and validate one request line; raises ProtocolError with a reason."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ProtocolError(f"request longer than {MAX_REQUEST_BYTES} bytes")
    try:
        body = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request is not UTF-8 JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("request must be a JSON object")
    if body.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {body.get('v')!r}; this engine speaks {VERSION} "
                            "(requests are bound to the calling process, not to a token)")
    op = body.get("op")
    extra = sorted(set(body) - {"v", "op", OP_FIELDS.get(op, "")})
    if op in OP_FIELDS and extra:
        # A token (or an instance name) copied from somewhere is not quietly ignored: it is refused.
        raise ProtocolError(f"unknown field {extra[0]!r} in a {op} request; a request names nobody, "
                            "the engine knows the calling process")
    if op == "custom_message":
        content = body.get("content")
        if not isinstance(content, str) or not content:
            raise ProtocolError("custom_message needs a non-empty 'content' string")
        if len(content) > MAX_CONTENT_CHARS:
            raise ProtocolError(f"custom_message content is over {MAX_CONTENT_CHARS} characters")
    elif op == "set_retryable_errors":
        errors = body.get("errors")
        if not isinstance(errors, list) or not all(isinstance(e, str) and e.strip() for e in errors):
            raise ProtocolError("set_retryable_errors needs a list of non-empty strings")
        if len(errors) > MAX_KEYWORDS or any(len(e) > MAX_KEYWORD_CHARS for e in errors):
            raise ProtocolError(f"at most {MAX_KEYWORDS} keywords of at most {MAX_KEYWORD_CHARS} characters")
    elif op == "set_hang_interval":
        body["interval"] = check_interval(body.get("interval"))
    elif op == "report_progress":
        body["step"] = check_step(body.get("step"))
    else:
        raise ProtocolError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    return body


def encode_response(ok: bool, text: str = "") -> bytes:
    body = {"ok": ok, "detail" if ok else "error": text}
    return (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8")
