"""runtime/connections.py through the SDK endpoint (runtime/control.py) and
the C4D socket: connections are capped per origin and in all, an idle SDK
connection is closed, and refusals are counted with a bounded few told."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from trainwarden.runtime import control
from trainwarden.runtime.connections import RefusalLog
from trainwarden.runtime.control import MAX_CALLS_PER_INCARNATION, UNKNOWN_ORIGIN, ControlServer, Incarnation


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server():
    refused = []
    endpoint = ControlServer(deliver=lambda pending: None, on_refused=lambda reason, raw: refused.append(reason))
    endpoint.told = refused
    yield endpoint
    endpoint.close()


def _connect(path: str) -> socket.socket:
    from trainwarden.sdk.job_monitor import _connected

    return _connected(path, 5.0)  # as the SDK connects: a full backlog is waited out


def _answer(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data) if data else {}


def _wait(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_connections_past_an_origins_cap_are_answered_with_the_reason_and_closed_at_once(server):
    held = [_connect(server.address) for _ in range(MAX_CALLS_PER_INCARNATION)]
    _wait(lambda: server.open_connections == MAX_CALLS_PER_INCARNATION, "the held connections")
    extra = _connect(server.address)
    answer = _answer(extra)
    assert answer["ok"] is False and "refused" in answer["error"], answer
    assert f"{MAX_CALLS_PER_INCARNATION} connections of {UNKNOWN_ORIGIN} are open" in answer["error"]
    assert server.refusals.total == 1 and server.open_connections == MAX_CALLS_PER_INCARNATION
    for conn in held:
        conn.close()
    _wait(lambda: server.open_connections == 0, "the held connections to be let go")


def test_an_sdk_connection_that_sends_no_whole_request_is_closed_after_the_idle_limit(server, monkeypatch):
    monkeypatch.setattr(control, "IDLE_S", 0.3)
    conn = _connect(server.address)
    conn.sendall(b'{"v": 2, "op": ')  # a trickle, never a whole line
    started = time.monotonic()
    assert conn.recv(100) == b""  # closed by the endpoint
    assert time.monotonic() - started < 3
    _wait(lambda: server.idle_closed == 1 and server.open_connections == 0, "the idle count")
    assert any("sent no whole request within 0.3 s" in reason for reason in server.told), server.told


def test_a_flood_of_refusals_is_told_a_few_times_and_counted_whole(server):
    held = [_connect(server.address) for _ in range(MAX_CALLS_PER_INCARNATION)]
    _wait(lambda: server.open_connections == MAX_CALLS_PER_INCARNATION, "the held connections")
    for _ in range(300):
        _connect(server.address).close()
    _wait(lambda: server.refusals.total == 300, "300 refusals")
    assert len(server.told) == server.refusals.told_per_window, server.told
    for conn in held:
        conn.close()


def test_refusals_past_the_told_few_are_told_as_one_count_when_their_window_ends():
    clock, told = Clock(), []
    log = RefusalLog(lambda origin, reason, count: told.append((origin, reason, count)), every_s=10,
                     told_per_window=2, clock=clock)
    assert [log.refuse("job a", f"r{i}") for i in range(5)] == [True, True, False, False, False]
    assert log.refuse("job b", "b0") is True  # each origin has its own few
    log.flush()
    assert told == []
    clock.now = 10.0
    log.flush()
    assert told == [("job a", "r4", 3)] and log.total == 6
    assert log.refuse("job a", "again") is True  # a new window


def test_an_instances_call_is_served_while_another_origin_is_at_its_cap(tmp_path):
    def take(pending):
        if pending.take():
            pending.resolve(True, "taken")

    endpoint = ControlServer(deliver=take)
    token = endpoint.issue_token(Incarnation("job-1", "worker-0", 0, 0))
    script = ("import sys; from trainwarden.sdk import job_monitor as jm; "
              "print(jm.Monitor().report_progress(7).to_string())")
    held = [_connect(endpoint.address) for _ in range(MAX_CALLS_PER_INCARNATION)]  # this process: no incarnation
    try:
        _wait(lambda: endpoint.open_connections == MAX_CALLS_PER_INCARNATION, "the held connections")
        env = dict(os.environ, TRAINWARDEN_SDK_SOCKET=endpoint.address)
        child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        endpoint.bind(token, child.pid)
        out, _ = child.communicate(timeout=30)
        assert out.strip() == "OK: taken", out
        refused = _connect(endpoint.address)
        assert _answer(refused)["ok"] is False  # the flooding origin is still at its cap
    finally:
        for conn in held:
            conn.close()
        endpoint.close()


def test_the_c4d_socket_holds_at_most_its_collectors_and_counts_the_others(tmp_path):
    from trainwarden.runtime.c4d_source import MAX_COLLECTORS, C4DSocket

    lines, refused = [], []
    endpoint = ControlServer(deliver=lambda pending: None)
    channel = C4DSocket(tmp_path / "c4d.sock", lines.append, lambda reason, attempt: refused.append(reason),
                        endpoint)
    try:
        collectors = [_connect(str(tmp_path / "c4d.sock")) for _ in range(MAX_COLLECTORS)]
        _wait(lambda: channel._server.open == MAX_COLLECTORS, "the collectors")
        extra = _connect(str(tmp_path / "c4d.sock"))
        assert extra.recv(10) == b""  # refused: closed at once
        assert channel.refused == 1 and any("C4D connection refused" in r for r in refused), refused
        collectors[0].sendall(b"a line\n")
        _wait(lambda: lines == ["a line"], "the collector's line")
        for conn in collectors:
            conn.close()
    finally:
        channel.close()
        endpoint.close()


def test_many_threads_connecting_at_once_never_pass_the_total_cap(server, monkeypatch):
    monkeypatch.setattr(server._server, "total", 8)
    peak = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak.append(server.open_connections)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    held = []
    for _ in range(40):
        try:
            held.append(_connect(server.address))
        except OSError:
            pass
    time.sleep(0.2)
    stop.set()
    watcher.join()
    assert max(peak) <= 8
    for conn in held:
        conn.close()
