"""On an 80-column terminal (a real one: tmux) the tables keep ids and counts whole and the message gives way."""

import os
import shlex
import shutil
import subprocess
import time
import uuid

import pytest

from trainwarden.store import open_writer

from tests.conftest import ROOT, TRAINWARDEN
from tests.history_seed import JOB_A, JOB_B, NODES, seed

TMUX = shutil.which("tmux") or "/usr/bin/tmux"
pytestmark = pytest.mark.skipif(not os.path.exists(TMUX), reason="tmux is not installed")


# A server of our own, kept up by an idle session: when the last session of a
# server ends the server exits, and a session started meanwhile fails ("server
# exited unexpectedly").
SOCKET: list[str] = []  # the server's socket, in the module's temporary directory


def tmux(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([TMUX, "-S", SOCKET[0], *args], **kwargs)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    store = tmp_path_factory.mktemp("narrow") / "store"
    seed(open_writer(store))
    SOCKET[:] = [str(store.parent / "tmux.sock")]
    tmux("new-session", "-d", "-s", "keeper", "sleep 3600", check=True, env=_clean_env())
    yield store
    tmux("kill-server", capture_output=True)


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("TMUX", "COLUMNS", "LINES")}


def on_terminal(store, *args: str, columns: int = 80) -> list[str]:
    """The screen after running the command in a detached columns x 24 tmux session."""
    session = f"tw-{uuid.uuid4().hex[:8]}"
    done = store.parent / f"{session}.done"
    command = " ".join(shlex.quote(a) for a in [*TRAINWARDEN, *args])
    script = (f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT / 'pipeline'))} "
              f"TRAINWARDEN_STORE={shlex.quote(str(store))} {command}; touch {shlex.quote(str(done))}; sleep 60")
    tmux("new-session", "-d", "-s", session, "-x", str(columns), "-y", "24", "bash", "-c", script, check=True,
         env=_clean_env())
    try:
        deadline = time.time() + 60
        while not done.exists():
            assert time.time() < deadline, "the command did not finish in 60 s"
            time.sleep(0.2)
        screen = tmux("capture-pane", "-p", "-t", session, check=True, capture_output=True, text=True).stdout
    finally:
        tmux("kill-session", "-t", session, capture_output=True)
    return [line for line in screen.splitlines() if line.strip()]


def test_history_keeps_job_ids_instances_and_the_action_whole(seeded):
    screen = on_terminal(seeded, "history")
    header = screen[1].split()
    assert header == ["time", "job", "instance", "action", "message"], screen
    rows = screen[2:]
    assert len(rows) == 7 and all(len(line) <= 80 for line in screen), screen
    for line in rows:
        day, clock, job, instance, action = line.split()[:5]
        assert job in (JOB_A, JOB_B) and instance.startswith("worker-") and action in ("restart_job", "fail_job",
                                                                                      "isolate_node"), line
    assert any("RuntimeError: CUDA" in line and line.endswith("…") for line in rows), rows
    assert screen[0].startswith("Fault records (hidden") and "node" in screen[0] and "action" not in screen[0]


def test_history_of_jobs_with_generated_ids_fits_80_columns_and_keeps_the_action(tmp_path, monkeypatch):
    # `run` makes ids like train-20261206-090809-259e: with them the rows were 85 characters and wrapped.
    import tests.history_seed as history_seed

    monkeypatch.setattr(history_seed, "JOB_A", "train-20261206-090809-259e")
    monkeypatch.setattr(history_seed, "JOB_B", "retry_once-20261206-091522-0c1f")
    store = tmp_path / "store"
    seed(open_writer(store))
    # A server of this test's own; the module's server, which later tests use, stays as it was.
    module_socket = SOCKET[:]
    SOCKET[:] = [str(tmp_path / "tmux.sock")]
    tmux("new-session", "-d", "-s", "keeper", "sleep 3600", check=True, env=_clean_env())
    try:
        screen = on_terminal(store, "history")
    finally:
        tmux("kill-server", capture_output=True)
        SOCKET[:] = module_socket
    assert all(len(line) <= 80 for line in screen), screen
    assert "action" in screen[1].split() and "retry_once-20261206-091522-0c1f" in "\n".join(screen), screen


def test_aggregate_keeps_counts_codes_nodes_and_instances(seeded):
    screen = on_terminal(seeded, "history", "--aggregate")
    header = screen[1].split()
    for column in ("count", "code", "error", "node", "instance"):
        assert column in header, screen
    rows = [line.split() for line in screen[2:]]
    assert sorted(int(r[0]) for r in rows) == [1, 1, 1, 2, 2] and all(len(line) <= 80 for line in screen), screen
    assert all(any(n in r for n in NODES) and any(w.startswith("worker-") for w in r) for r in rows), rows


def test_a_wide_terminal_shows_every_column_and_whole_messages(seeded):
    screen = on_terminal(seeded, "history", columns=200)
    assert screen[0] == "Fault records" and screen[1].split()[6:9] == ["source", "action", "result"], screen
    assert any(line.rstrip().endswith("RuntimeError: CUDA error: out of memory (tried 0 GiB)") for line in screen)
