"""The SDK against a real control server (a Unix socket bound to process
trees), and without any engine."""

import os
import socket
import subprocess
import sys
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
        # This test process plays the instance: its calls are worker-0's.
        self.token = self.server.issue_token(Incarnation("job-1", "worker-0", 0, 0))
        self.server.bind(self.token, os.getpid())

    def _take(self, pending):
        self.messages.append(pending.message)
        pending.resolve(True, "taken")


@pytest.fixture
def engine(monkeypatch):
    e = Engine()
    monkeypatch.setenv("TRAINWARDEN_SDK_SOCKET", e.server.address)
    monkeypatch.setattr(jm, "_default_monitor", None)
    monkeypatch.setattr(jm, "_current_interval", None)
    yield e
    e.server.close()


def test_without_an_engine_every_call_returns_a_failed_status_at_once(monkeypatch):
    monkeypatch.delenv("TRAINWARDEN_SDK_SOCKET", raising=False)
    monkeypatch.delenv("TRAINWARDEN_CONTROL", raising=False)
    started = time.time()
    monitor = jm.Monitor(config=jm.PyTorchConfig())
    st = monitor.send_custom_message(content="loss is NaN")
    assert not st.ok() and "no Trainwarden engine" in st.to_string()
    assert not monitor.set_retryable_errors(["x"]).ok()
    assert time.time() - started < 0.5


def test_an_unreachable_engine_gives_a_failed_status_without_raising(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINWARDEN_SDK_SOCKET", str(tmp_path / "nobody-listens.sock"))
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


def test_progress_reaches_the_engine_as_a_step_and_a_bad_step_is_refused_before_sending(engine):
    monitor = jm.Monitor()
    assert monitor.report_progress(1200).ok()
    assert monitor.report_progress(2400.0).ok()
    for bad in (-1, 1.5, "12", True, protocol.MAX_STEP + 1):
        st = monitor.report_progress(bad)
        assert not st.ok() and "progress step" in st.to_string(), bad
    assert [(m.op, m.step) for m in engine.messages] == [(SdkOp.REPORT_PROGRESS, 1200), (SdkOp.REPORT_PROGRESS, 2400)]


def test_config_parameters_are_applied_when_the_monitor_is_made(engine):
    jm.Monitor(config=jm.PyTorchConfig(job_hang_interval=1800))
    assert engine.messages[0].interval == 1800


def test_a_process_of_no_incarnation_is_refused_and_counted(monkeypatch):
    engine = Engine()
    try:
        # worker-0 is another process now; this test process belongs to no incarnation.
        with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as other:
            engine.server.revoke(engine.token)
            engine.server.bind(engine.server.issue_token(Incarnation("job-1", "worker-0", 0, 0)), other.pid)
            monkeypatch.setenv("TRAINWARDEN_SDK_SOCKET", engine.server.address)
            st = jm.Monitor().send_custom_message(content="x")
            other.kill()
        assert not st.ok() and f"pid {os.getpid()}" in st.to_string(), st.to_string()
        assert engine.messages == [] and len(engine.refused) == 1
    finally:
        engine.server.close()


def test_a_descendant_of_the_instance_speaks_for_it_whatever_token_it_carries(engine):
    code = ("from trainwarden.sdk import job_monitor as jm; "
            "print(jm.Monitor().send_custom_message(content='from a child').to_string())")
    env = dict(os.environ, TRAINWARDEN_SDK_SOCKET=engine.server.address, TRAINWARDEN_TOKEN="someone-elses")
    # setsid: a session of its own keeps the parent chain.
    out = subprocess.run(["setsid", sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip().startswith("OK"), out
    [m] = engine.messages
    assert (m.job_id, m.instance, m.content) == ("job-1", "worker-0", "from a child")


def test_a_version_1_request_with_a_token_is_refused(engine):
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(engine.server.address)
        conn.sendall(f'{{"v": 1, "token": "{engine.token}", "op": "custom_message", "content": "x"}}\n'.encode())
        reply = conn.makefile("rb").readline().decode()
    assert '"ok": false' in reply and "version" in reply
    assert engine.messages == [] and engine.refused


def test_the_socket_lives_in_a_directory_only_this_user_can_enter(engine):
    directory = os.stat(os.path.dirname(engine.server.address))
    assert directory.st_mode & 0o777 == 0o700 and directory.st_uid == os.getuid()


@pytest.mark.parametrize("raw, words", [
    (b"\xff\xfe not json", "UTF-8 JSON"),
    (b'{"v": 2, "op": "reboot"}', "unknown op"),
    (b'{"v": 2, "token": "copied", "op": "custom_message", "content": "x"}', "unknown field 'token'"),
    (b'{"v": 9, "op": "custom_message", "content": "x"}', "version"),
    (b'{"v": 2, "op": "set_hang_interval", "interval": 0}', "hang interval"),
    (b'{"v": 2, "op": "set_retryable_errors", "errors": "x"}', "list"),
    (b'{"v": 2, "op": "report_progress", "step": -3}', "progress step"),
    (b'{"v": 2, "op": "report_progress", "step": "many"}', "progress step"),
    (b'{"v": 2, "op": "report_progress", "step": 5, "instance": "worker-1"}', "unknown field 'instance'"),
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
