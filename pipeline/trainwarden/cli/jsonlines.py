"""``run -o json``: the run as JSON lines on standard output, one object per
event, for programs that follow a job (CI steps, notebooks, log shippers).

Every object has ``event`` and ``time`` (seconds since the epoch). Job text
(output lines, error messages) is a JSON string like any other value: no
markup, no escapes of the terminal's, nothing cut. Events:

- ``job_started``: job_id, instances, store, log_dir
- ``round``: round (the job's restart count; the first is 0), at its first instance start
- ``instance_started``: instance, round, start, node, pid
- ``line``: instance, round, start, stream, text (not with --quiet)
- ``instance_exited``: instance, round, start, exit_code
- ``decision``: the decision's fields as on the bus (docs/MESSAGES.md), as ``submit --follow -o json``
  prints them
- ``info``: text (what the console would say: stack reports, interruptions, warnings)
- ``job_finished``: job_id, status, reason, restarts, exit_code, dead_letters, counters
"""

from __future__ import annotations

import json
import sys
from typing import IO, Optional

from trainwarden.clock import now as clock_now
from trainwarden.events import Decision, InstanceExited, InstanceStarted, LogLine
from trainwarden.services.follow import decision_event, line_event


class JsonReporter:
    def __init__(self, quiet_output: bool = False, stream: Optional[IO[str]] = None):
        self.quiet_output = quiet_output
        self.stream = stream or sys.stdout
        self.round = -1
        self.closed = False

    def emit(self, event: str, time: Optional[float] = None, **fields: object) -> None:
        self._write({"event": event, "time": clock_now() if time is None else time, **fields})

    def _write(self, event: dict) -> None:
        if self.closed:
            return
        try:
            self.stream.write(json.dumps(event, ensure_ascii=False) + "\n")
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True  # the reader went away; the job goes on

    def line(self, event: LogLine) -> None:
        if not self.quiet_output:
            self._write(line_event(event))

    def lifecycle(self, event: InstanceStarted | InstanceExited) -> None:
        common = dict(job_id=event.job_id, instance=event.instance, round=event.round, start=event.start)
        if isinstance(event, InstanceStarted):
            if event.round > self.round:
                self.round = event.round
                self.emit("round", event.time, job_id=event.job_id, round=event.round)
            self.emit("instance_started", event.time, **common, node=event.node, pid=event.pid)
        else:
            self.emit("instance_exited", event.time, **common, exit_code=event.exit_code)

    def decision(self, d: Decision) -> None:
        self._write(decision_event(d))
        self.flush()

    def info(self, text: str) -> None:
        self.emit("info", text=text)
        self.flush()

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True
