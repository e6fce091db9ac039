"""The services' log lines: one format for everything a service says, its
own sentences and the library loggers under ``trainwarden.*`` alike.

    text: 2026-12-01T15:50:00.123Z INFO processor: running
          2026-12-01T15:50:03.456Z WARNING actuator job=resnet-42: the job asks for ...
    json: {"time": "...", "level": "info", "component": "processor", "job_id": "", "message": "running"}

Job text (a job id, an error message quoted in a sentence) is data: in JSON
it is escaped by the encoder, and in text a line break of it is written as
``\\n`` so that one record is always one line.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import IO, Optional

FORMATS = ("text", "json")
# What the service loop calls a level, as the logging module knows it. A
# health line is information; the loop's own wording says it is one.
LEVELS = {"info": logging.INFO, "health": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _timestamp(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class _Formatter(logging.Formatter):
    def __init__(self, fmt: str, component: str):
        super().__init__()
        self.json = fmt == "json"
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        component = getattr(record, "component", "") or self.component
        job_id = getattr(record, "job_id", "") or ""
        message = record.getMessage()
        if self.json:
            return json.dumps({"time": _timestamp(record.created), "level": record.levelname.lower(),
                               "component": component, "job_id": job_id, "message": message},
                              ensure_ascii=False)
        job = f" job={_one_line(job_id)}" if job_id else ""
        return f"{_timestamp(record.created)} {record.levelname} {component}{job}: {_one_line(message)}"


def _one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


class ServiceLog:
    """``say(level, text, job_id="")`` for one service: the loop's levels
    (info, warning, error, health) become log records of ``trainwarden.service``.
    ``install()`` also sends the other ``trainwarden.*`` loggers (the
    notifier's delivery warnings, ...) through the same format."""

    def __init__(self, component: str, fmt: str = "text", stream: Optional[IO[str]] = None):
        if fmt not in FORMATS:
            raise ValueError(f"the log format is text or json, not {fmt!r}")
        self.component = component
        self.handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
        self.handler.setFormatter(_Formatter(fmt, component))
        self.logger = logging.Logger(f"trainwarden.service.{component}", logging.INFO)
        self.logger.addHandler(self.handler)
        self.logger.propagate = False

    def install(self) -> None:
        library = logging.getLogger("trainwarden")
        library.addHandler(self.handler)
        library.setLevel(logging.INFO)
        library.propagate = False

    def __call__(self, level: str, text: str, job_id: str = "") -> None:
        self.logger.log(LEVELS.get(level, logging.INFO), "%s", text, extra={"job_id": job_id})
