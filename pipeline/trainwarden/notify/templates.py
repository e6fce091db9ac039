"""Message bodies from Jinja2 templates, sandboxed, checked when loaded.

Templates come from git, but they are still code that runs in the notifier:
the immutable sandbox keeps them from calling methods that change state or
reach outside the data they are given, and bounds what they may compute
(notify/bounded.py). Undefined names are errors
(``StrictUndefined``), and every template is rendered at validation time with
a sample of every event type its subscription can receive, with and without
details and a suppressed count, so a typo fails ``notify validate`` with its
file and line instead of failing a delivery at 3 a.m.
"""

from __future__ import annotations

import dataclasses
import json
import traceback
from pathlib import Path
from typing import Optional

import jinja2

from trainwarden.notify.bounded import BoundedSandbox, range_budget
from trainwarden.notify.events import NotificationEvent, iso, sample_event
from trainwarden.yamlsrc import ConfigError

MAX_BODY_BYTES = 256 * 1024
BUILTIN = ("json", "slack", "dingtalk")


class _InlineLoader(jinja2.BaseLoader):
    """Bodies written inline in a subscription file, each with a file name of
    its own so that a runtime error's traceback tells which one failed."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[str, str]] = {}

    def get_source(self, environment, template):
        if template not in self.sources:
            raise jinja2.TemplateNotFound(template)
        source, filename = self.sources[template]
        return source, filename, lambda: True


class TemplateSet:
    """One sandboxed environment for a subscription directory: its own
    ``templates/`` first, then the shipped ones."""

    def __init__(self, search_dirs: list[Path]):
        self.inline = _InlineLoader()
        self.search_dirs = [d for d in search_dirs if d.is_dir()]
        self.env = BoundedSandbox(
            loader=jinja2.ChoiceLoader([self.inline, jinja2.FileSystemLoader([str(d) for d in self.search_dirs])]),
            undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
        self.env.filters["iso"] = iso
        self.env.filters["tojson"] = _tojson
        # Job text is data: these make chat markup show it as it is.
        self.env.filters["slack_text"] = slack_text
        self.env.filters["markdown_text"] = markdown_text
        # Chinese or accented text stays readable in the body (DingTalk, Slack).
        self.env.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": False}
        # inline file name -> (subscription file, line of the template's first line)
        self.inline_origin: dict[str, tuple[str, int]] = {}

    def inline_template(self, name: str, source: str, path: str, first_line: int) -> "BodyTemplate":
        filename = f"{path}#{name}"
        key = f"inline:{name}"
        self.inline.sources[key] = (source, filename)
        self.inline_origin[filename] = (path, first_line)
        return self._load(key, f"inline body of '{name}'", (path, first_line))

    def file_template(self, name: str, where: tuple[str, int]) -> "BodyTemplate":
        filename = f"{name}.j2"
        try:
            return self._load(filename, f"template '{name}'", where)
        except jinja2.TemplateNotFound:
            looked = ", ".join(str(d) for d in self.search_dirs) or "no templates directory"
            raise ConfigError(f"template '{name}' not found (looked for {filename} in {looked})", where[0],
                              where[1], hint="built-in templates: " + ", ".join(BUILTIN)) from None

    def _load(self, key: str, what: str, where: tuple[str, int]) -> "BodyTemplate":
        try:
            template = self.env.get_template(key)
        except jinja2.TemplateSyntaxError as exc:
            path, line = self.locate(exc.filename, exc.lineno, where)
            raise ConfigError(f"{what}: template syntax error: {exc.message}", path, line) from None
        return BodyTemplate(what=what, where=where, template=template, owner=self)

    def locate(self, filename: Optional[str], lineno: Optional[int], fallback: tuple[str, int]) -> tuple[str, int]:
        """A template line -> the file and line a person should open."""
        if filename in self.inline_origin:
            path, first = self.inline_origin[filename]
            return path, first + (lineno or 1) - 1
        if filename:
            return filename, lineno or 0
        return fallback

    def runtime_location(self, exc: BaseException, fallback: tuple[str, int]) -> tuple[str, int]:
        """Jinja rewrites tracebacks so template frames carry the template's
        file name and line: the last such frame is where rendering failed."""
        found = None
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename in self.inline_origin or frame.filename.endswith(".j2"):
                found = (frame.filename, frame.lineno)
        return self.locate(found[0], found[1], fallback) if found else fallback


@dataclasses.dataclass(frozen=True, eq=False)
class BodyTemplate:
    what: str  # "template 'slack'" or "inline body of 'ops'"
    where: tuple[str, int]  # where the subscription chose it
    template: jinja2.Template
    owner: TemplateSet

    def render(self, payload: dict, subscription: str) -> str:
        """The body for one payload. Raises RenderError naming file and line."""
        try:
            with range_budget():
                text = self.template.render(event=payload, type=payload["type"], timestamp=payload["timestamp"],
                                            data=payload["data"], subscription=subscription)
        except jinja2.TemplateError as exc:
            path, line = self.owner.runtime_location(exc, self.where)
            raise RenderError(f"{self.what}: {type(exc).__name__}: {exc}", path, line) from None
        except Exception as exc:  # noqa: BLE001 - a template can raise anything (e.g. division by zero)
            path, line = self.owner.runtime_location(exc, self.where)
            raise RenderError(f"{self.what}: {type(exc).__name__}: {exc}", path, line) from None
        if len(text.encode()) > MAX_BODY_BYTES:
            raise RenderError(f"{self.what}: the body is larger than {MAX_BODY_BYTES // 1024} KiB", *self.where)
        return text


def slack_text(value) -> str:
    """Slack's mrkdwn shows &, < and > only escaped (unescaped, "<!channel>"
    pings a channel and "<url|text>" is a link); a run of three backticks
    would close the code block the message is shown in."""
    _raise_undefined(value)
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("```", "`\u200b``")


_MARKDOWN_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>#|~"})


def markdown_text(value) -> str:
    """Markdown (DingTalk) shows job text as it is only with its special
    characters escaped: "[/path/pair.cc:561]" is not a link, "*" not emphasis."""
    _raise_undefined(value)
    return str(value).translate(_MARKDOWN_SPECIAL)


@jinja2.pass_eval_context
def _tojson(eval_ctx, value, indent=None):
    """Jinja's tojson, except that an undefined name fails as undefined (naming
    it) instead of as "not JSON serializable"."""
    _raise_undefined(value)
    return _BUILTIN_TOJSON(eval_ctx, value, indent)


def _raise_undefined(value) -> None:
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    elif isinstance(value, dict):
        for item in value.values():
            _raise_undefined(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _raise_undefined(item)


_BUILTIN_TOJSON = jinja2.filters.do_tojson


class RenderError(ConfigError):
    """A template that failed on one payload; the message names file and line."""


def check_template(template: BodyTemplate, name: str, event_types: list[str], content_type: str) -> None:
    """Render every sample this subscription could get; raise on the first failure."""
    is_json = content_type.split(";")[0].strip().lower().endswith("json")
    for event_type in event_types:
        for with_details in (True, False):
            for suppressed in (0, 3):
                event: NotificationEvent = sample_event(event_type, with_details=with_details)
                payload = event.payload(suppressed, event.time - 60 if suppressed else 0.0)
                try:
                    body = template.render(payload, name)
                except RenderError as exc:
                    raise RenderError(f"{_strip_where(exc)} (rendering a sample {event_type} event)",
                                      exc.path, exc.line) from None
                if is_json:
                    try:
                        json.loads(body)
                    except ValueError as exc:
                        raise ConfigError(
                            f"{template.what} does not render valid JSON for a sample {event_type} event: {exc}",
                            *template.where, hint="use the tojson filter for every value: {{ data.summary | "
                                                  "tojson }}") from None


def _strip_where(exc: ConfigError) -> str:
    text = str(exc)
    prefix = f"{exc.path}:{exc.line}: " if exc.path and exc.line else (f"{exc.path}: " if exc.path else "")
    return text[len(prefix):] if text.startswith(prefix) else text
