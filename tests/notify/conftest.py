"""Fixtures: real local receivers, subscription directories, notifiers."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from pipeline.notify import MemoryDeliveryLog, Notifier, load_subscriptions
from tests.notify.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"trainwarden-test-signing-key-0123456789").decode()
ENV = {"TW_SECRET": SECRET, "TW_TOKEN": "token-value-never-logged"}


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
