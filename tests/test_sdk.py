"""The SDK against a real control server on loopback, and without any engine."""

import importlib
import socket
import sys
import threading
import time

import pytest

from trainwarden.events import SdkOp
from trainwarden.runtime.control import ControlServer, Incarnation
from trainwarden.sdk import job_monitor as jm
from trainwarden.sdk import protocol


class Engine:
    """Plays the service loop: takes every message and answers it."""

    def __init__(self):
        self.messages = []
        self.refused = []
        self.server = ControlServer(deliver=self._take, on_refused=lambda r, raw: self.refused.append(r))
        self.token = self.server.issue_token(Incarnation("job-1", "worker-0", 0, 0))

    def _take(self, pending):
        self.messages.append(pending.message)
        pending.resolve(True, "taken")


@pytest.fixture
def engine(monkeypatch):
    e = Engine()
    monkeypatch.setenv("TRAINWARDEN_CONTROL", e.server.address)
    monkeypatch.setenv("TRAINWARDEN_TOKEN", e.token)
    monkeypatch.setattr(jm, "_default_monitor", None)
    monkeypatch.setattr(jm, "_current_interval", None)
    yield e
    e.server.close()


def test_without_an_engine_every_call_returns_a_failed_status_at_once(monkeypatch):
    monkeypatch.delenv("TRAINWARDEN_CONTROL", raising=False)
    started = time.time()
    monitor = jm.Monitor(config=jm.PyTorchConfig())
    st = monitor.send_custom_message(content="loss is NaN")
    assert not st.ok() and "no Trainwarden engine" in st.to_string()
    assert not monitor.set_retryable_errors(["x"]).ok()
    assert time.time() - started < 0.5


def test_an_unreachable_engine_gives_a_failed_status_without_raising(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("TRAINWARDEN_CONTROL", f"127.0.0.1:{port}")
    monkeypatch.setenv("TRAINWARDEN_TOKEN", "t")
    st = jm.Monitor().send_custom_message(content="x")
    assert not st.ok() and "did not answer" in st.to_string()


def test_a_custom_message_reaches_the_engine_before_the_call_returns(engine):
    st = jm.Monitor(config=jm.PyTorchConfig()).send_custom_message(content="The training loss of the job is NaN.")
    assert st.ok(), st.to_string()
    [m] = engine.messages
    assert m.op is SdkOp.CUSTOM_MESSAGE and m.instance == "worker-0" and m.content.endswith("NaN.")


def test_retryable_keywords_are_sent_as_one_message(engine):
    assert jm.Monitor(config=jm.TFConfig()).set_retryable_errors(["connect timeout", "error_yyy"]).ok()
    assert engine.messages[0].keywords == ("connect timeout", "error_yyy")


def test_hang_detect_sets_the_interval_and_restores_the_previous_one_even_on_error(engine):
    @jm.hang_detect(180)
    def train():
        inner()

    @jm.hang_detect(-1)
    def inner():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        train()
    assert [m.interval for m in engine.messages] == [180, -1, 180, None]


def test_reset_config_accepts_the_documented_parameters_and_refuses_others(engine):
    monitor = jm.Monitor()
    assert monitor.reset_config(job_hang_interval=10).ok()
    assert monitor.reset_config({"enable_job_hang_detection": False}).ok()
    st = monitor.reset_config(job_hang_intervl=10)
    assert not st.ok() and "job_hang_intervl" in st.to_string() and "job_hang_interval" in st.to_string()
    assert [m.interval for m in engine.messages] == [10, -1]


def test_config_parameters_are_applied_when_the_monitor_is_made(engine):
    jm.Monitor(config=jm.PyTorchConfig(job_hang_interval=1800))
    assert engine.messages[0].interval == 1800


def test_a_request_with_an_unknown_token_is_refused_and_counted(engine, monkeypatch):
    monkeypatch.setenv("TRAINWARDEN_TOKEN", "forged")
    st = jm.Monitor().send_custom_message(content="x")
    assert not st.ok() and "token" in st.to_string()
    assert engine.messages == [] and engine.refused


@pytest.mark.parametrize("raw, words", [
    (b"\xff\xfe not json", "UTF-8 JSON"),
    (b'{"v": 1, "token": "t", "op": "reboot"}', "unknown op"),
    (b'{"v": 9, "token": "t", "op": "custom_message", "content": "x"}', "version"),
    (b'{"v": 1, "token": "t", "op": "set_hang_interval", "interval": 0}', "hang interval"),
    (b'{"v": 1, "token": "t", "op": "set_retryable_errors", "errors": "x"}', "list"),
    (b"x" * (protocol.MAX_REQUEST_BYTES + 1), "longer"),
])
def test_malformed_requests_are_refused_with_a_reason(raw, words):
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.decode_request(raw)
    assert words in str(caught.value)


def test_importing_the_sdk_pulls_in_no_heavy_dependency():
    heavy = ("yaml", "msgspec", "rich", "chdb", "clickhouse_connect", "kafka", "jinja2")
    code = ("import sys; import trainwarden.sdk.job_monitor; "
            f"print([m for m in sys.modules if m.split('.')[0] in {heavy!r}])")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
