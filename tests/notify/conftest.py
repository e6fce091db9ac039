"""Fixtures: real local receivers, subscription directories, notifiers."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from trainwarden.events import Decision, InstanceStarted, SdkMessage, SdkOp
from trainwarden.notify import MemoryDeliveryLog, Notifier, load_subscriptions
from tests.builders import Job
from tests.notify.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"trainwarden-test-signing-key-0123456789").decode()
ENV = {"TW_SECRET": SECRET, "TW_TOKEN": "token-value-never-logged"}


def crash_then_nan_decisions() -> list[Decision]:
    """The engine's decisions for a two-worker job: worker-1 crashes with an NCCL
    error, the job restarts, worker-0 reports a NaN loss, both finish."""
    job = Job("--enable-job-restart=True")
    job.at(1).exit("worker-1", 1, "RuntimeError: NCCL error: unhandled system error")
    for name in ("worker-0", "worker-1"):
        job.feed(InstanceStarted(job_id="job-1", time=job.now, instance=name, round=1, start=1))
    job.at(2).feed(SdkMessage(job_id="job-1", time=job.now, instance="worker-0", round=1, start=1,
                              op=SdkOp.CUSTOM_MESSAGE, content="The training loss of the job is NaN."))
    job.at(3).exit("worker-0", 0)
    job.at(3).exit("worker-1", 0)
    return job.decisions


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(script=(), default=200, body=b"ok", delay=0.0) -> Receiver:
        made.append(Receiver(list(script), default, body, delay))
        return made[-1]

    yield make
    for r in made:
        r.close()


def subscription_yaml(name: str, url: str, extra: str = "", retry: str = "{max_attempts: 4, backoff_s: 0.05, "
                      "max_backoff_s: 0.2}", rate: float = 0, timeout: float = 2.0, private: bool = False) -> str:
    """One subscription; small backoffs and no rate limit unless asked. ``private``
    lets a process without the allow_loopback flag reach the local receiver."""
    return textwrap.dedent(f"""\
          - name: {name}
            target:
              url: {url}
              timeout_s: {timeout}
              allow_private_targets: {str(private).lower()}
              headers: {{Authorization: "Bearer ${{TW_TOKEN}}"}}
            secret: ${{TW_SECRET}}
            rate_limit: {{interval_s: {rate}}}
            retry: {retry}
        """) + textwrap.indent(textwrap.dedent(extra), "  ")


@pytest.fixture
def subs_dir(tmp_path):
    def write(*subscriptions: str, name: str = "subs.yaml") -> Path:
        directory = tmp_path / "notifications"
        directory.mkdir(exist_ok=True)
        (directory / name).write_text("version: 1\nsubscriptions:\n" + "".join(subscriptions))
        return directory

    return write


@pytest.fixture
def notifier_for(tmp_path):
    made: list[Notifier] = []

    def make(directory: Path, state: Path | None = None, log: MemoryDeliveryLog | None = None, **kw):
        subs = load_subscriptions(directory, allow_loopback=True)
        log = log if log is not None else MemoryDeliveryLog()
        kw.setdefault("env", ENV)
        notifier = Notifier(subs, state or tmp_path / "state", writer=log, allow_loopback=True, **kw)
        notifier.log = log  # for the test's convenience
        made.append(notifier)
        return notifier

    yield make
    for n in made:
        if not n._closed:
            n.close(timeout_s=1)
