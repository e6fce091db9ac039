"""``preload`` on the slurm runtime: a standby host per node inside the
allocation (runtime/slurm/standby_host.py) whose warm interpreters become
the rounds' instances (task.py), adopted by the agents through the task
wrapper's token (proof.py).

The host, the hand-over protocol and the proof run here without Slurm; the
jobs need the real one (TRAINWARDEN_SLURM=1 and SLURM_CONF, as the other
tests in this directory)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trainwarden.jobspec import from_command
from trainwarden.runtime.slurm import handoff
from trainwarden.runtime.slurm.proof import can_prove, standby_token
from trainwarden.runtime.slurm.standby_host import Host, sweep

PROBE = textwrap.dedent("""\
    import os, time
    IMPORTED_AT = time.time()
    RANK_AT_IMPORT = os.environ.get("RANK")
    with open(os.path.join(os.environ["TW_MARKS"], f"imported-{os.getpid()}"), "w") as f:
        f.write(repr(RANK_AT_IMPORT))
""")
JOB = textwrap.dedent("""\
    import glob, os, sys, time
    started = time.time()
    probe = sys.modules.get("tw_slurm_probe")
    rank, round_ = int(os.environ["RANK"]), int(os.environ["TRAINWARDEN_RESTART_ROUND"])
    marks = os.environ["TW_MARKS"]
    print(f"rank {rank} round {round_} pid {os.getpid()} preloaded {probe is not None}"
          f" before_start {probe is not None and probe.IMPORTED_AT < started}"
          f" imported_at {probe.IMPORTED_AT if probe else 0:.6f}"
          f" rank_at_import {probe.RANK_AT_IMPORT if probe else '-'} cwd {os.getcwd()}", flush=True)
    open(os.path.join(marks, f"rank{rank}-round{round_}"), "w").close()
    if rank == 1 and round_ == 0 and os.environ.get("TW_FAIL") == "1":
        # Rank 0 has said its line, and the next round's spares have imported
        # the probe (two imports per node), before the fault.
        deadline = time.time() + 40
        while time.time() < deadline and not (os.path.exists(os.path.join(marks, "rank0-round0"))
                                              and len(glob.glob(os.path.join(marks, "imported-*"))) >= 4):
            time.sleep(0.05)
        print(f"failing at {time.time():.6f}", flush=True)
        print("socket.gaierror: [Errno -3] Temporary failure in name resolution", file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(60 if round_ == 0 else 0.5)
""")


# ------------------------------------------------------------ pure logic

def test_the_workdir_wrapper_is_unwrapped_into_the_command_and_its_directory():
    command = [sys.executable, "train.py", "--lr", "1"]
    assert handoff.unwrap_workdir(handoff.in_workdir("/data/run", command)) == (command, "/data/run")
    assert handoff.unwrap_workdir(command) == (command, None)
    # Another shell script is not the wrapper: it runs as it is.
    other = ["/bin/sh", "-c", 'cd "$0" && exec "$@" && rm -rf /', "/data", *command]
    assert handoff.unwrap_workdir(other) == (other, None)
    assert handoff.unwrap_workdir(["/bin/sh", "-c", handoff.WORKDIR_SCRIPT, "/data"]) == (
        ["/bin/sh", "-c", handoff.WORKDIR_SCRIPT, "/data"], None)


def test_the_shared_environment_leaves_out_what_changes_with_every_step():
    env = {"PATH": "/bin", "SLURM_STEP_ID": "3", "SLURM_PROCID": "1", "SLURMD_NODENAME": "n1",
           handoff.TASK_TOKENS: "a b", "PYTHONPATH": "/x"}
    assert handoff.shared_env(env) == {"PATH": "/bin", "SLURMD_NODENAME": "n1", "PYTHONPATH": "/x"}


def test_a_socket_path_fits_sun_path_whatever_the_node_is_called(tmp_path):
    assert handoff.socket_path(tmp_path, 12, 1, "n1") == tmp_path / "12.r1.n1.sock"
    long = handoff.socket_path(tmp_path, 12, 1, "node-" * 40)
    assert len(str(long)) <= 108 and long.parent == tmp_path
    assert handoff.socket_path(tmp_path, 12, 1, "../evil").parent == tmp_path


def test_a_directory_others_may_enter_is_refused(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(PermissionError):
        handoff.private_directory(open_dir, create=False)
    link = tmp_path / "link"
    private = handoff.private_directory(tmp_path / "private", create=True)
    link.symlink_to(private)
    with pytest.raises(PermissionError):
        handoff.private_directory(link, create=False)
    assert os.stat(private).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("message,why", [
    ({"run": {"instance": "w", "command": [], "env": {}, "cwd": "/"}}, "command"),
    ({"run": {"instance": "w", "command": ["python"], "env": {"A": 1}, "cwd": "/"}}, "env"),
    ({"run": {"instance": "w", "command": ["python"], "env": {"A=B": "1"}, "cwd": "/"}}, "env"),
    ({"run": {"instance": "w", "command": ["python"], "env": {}, "cwd": "relative"}}, "cwd"),
    ({"run": {"instance": "", "command": ["python"], "env": {}, "cwd": "/"}}, "instance"),
    ({"run": {"instance": "w", "command": ["py\0thon"], "env": {}, "cwd": "/"}}, "NUL"),
    ({"become": {}}, "no run request"),
])
def test_a_malformed_request_is_refused_saying_what_is_wrong(message, why):
    with pytest.raises(handoff.HandoffError, match=why):
        handoff.run_request(message)


def test_a_message_over_the_limit_or_not_an_object_ends_the_reading():
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b"[1, 2]\n")
        with pytest.raises(handoff.HandoffError, match="not a JSON object"):
            handoff.Reader(left).message()
        threading.Thread(target=lambda: right.sendall(b"x" * (handoff.MESSAGE_MAX + 70_000)), daemon=True).start()
        with pytest.raises(handoff.HandoffError, match="over"):
            handoff.Reader(left).message()


# ------------------------------------------------------------ the host, without Slurm

@pytest.fixture
def host(tmp_path):
    (tmp_path / "tw_slurm_probe.py").write_text(PROBE)
    root = handoff.private_directory(tmp_path / "sockets", create=True)
    made = Host(("tw_slurm_probe",), handoff.socket_path(root, 7, 0, "n1"))
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.close()
    thread.join(10)


def _ask(path: Path, message, fds=()) -> tuple[socket.socket, handoff.Reader, dict]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(str(path))
    if isinstance(message, bytes):
        conn.sendall(message)
    else:
        handoff.send(conn, message, fds)
    reader = handoff.Reader(conn)
    return conn, reader, reader.message()


def _request(tmp_path, code: str) -> dict:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "TW_MARKS": str(tmp_path), "RANK": "3"}
    return {"run": {"instance": "worker-3", "command": [sys.executable, "-c", code], "env": env,
                    "cwd": str(tmp_path)}}


def test_the_host_refuses_what_is_not_a_request_and_serves_the_next_task(host, tmp_path):
    for bad in (b"not json\n", b'{"run": 1}\n', json.dumps(_request(tmp_path, "pass")).encode() + b"\n"):
        conn, _, answer = _ask(host.path, bad)
        conn.close()
        assert "refused" in answer, answer  # the last one brought no streams
    conn, _, answer = _ask(host.path, {"run": {**_request(tmp_path, "pass")["run"], "command": ["bash", "-c", "x"]}},
                           fds=(0, 1, 2))
    conn.close()
    assert "the interpreter 'bash' is not an absolute path" in answer["refused"], answer
    out = tmp_path / "task.out"
    with open(os.devnull, "rb") as stdin, open(out, "ab") as stdout:
        conn, reader, answer = _ask(host.path, _request(tmp_path, textwrap.dedent("""\
            import os, sys, tw_slurm_probe as p
            print("instance", os.environ["RANK"], p.RANK_AT_IMPORT, os.getcwd(), flush=True)
            sys.exit(5)""")), fds=(stdin.fileno(), stdout.fileno(), stdout.fileno()))
    with conn:
        assert isinstance(answer.get("pid"), int), answer
        assert reader.message() == {"exit": 5}
    assert out.read_text() == f"instance 3 None {tmp_path}\n"


def test_when_the_task_goes_away_the_host_kills_its_instance(host, tmp_path):
    with open(os.devnull, "rb") as stdin, open(tmp_path / "task.out", "ab") as stdout:
        conn, _, answer = _ask(host.path, _request(tmp_path, "import time; time.sleep(120)"),
                               fds=(stdin.fileno(), stdout.fileno(), stdout.fileno()))
    pid = answer["pid"]
    assert Path(f"/proc/{pid}").exists()
    conn.close()
    deadline = time.time() + 10
    while time.time() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)
    assert host.counters["dropped"] == 1


def test_a_sweep_removes_the_sockets_of_killed_hosts_and_keeps_a_listening_one(host, tmp_path):
    dead = host.path.parent / "3.r0.n2.sock"
    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(str(dead))
    killed.close()  # bound, never listening again: what a SIGKILLed host leaves
    assert sweep(host.path.parent) == 1
    assert not dead.exists() and host.path.exists()


@pytest.mark.skipif(not can_prove(), reason="this kernel has no kcmp")
def test_the_agent_accepts_a_standby_only_for_the_task_whose_streams_it_holds(host, tmp_path):
    token_env = {handoff.TASK_TOKENS: "tok-zero tok-one", "SLURM_PROCID": "1", "PATH": os.environ["PATH"]}
    with open(os.devnull, "rb") as stdin, open(tmp_path / "a.out", "ab") as out, open(tmp_path / "b.out", "ab") as b:
        task = subprocess.Popen(["sleep", "60"], stdin=stdin, stdout=out, stderr=out, env=token_env)
        stranger = subprocess.Popen(["sleep", "60"], stdin=stdin, stdout=b, stderr=b, env=token_env)
        conn, _, answer = _ask(host.path, _request(tmp_path, "import time; time.sleep(60)"),
                               fds=(stdin.fileno(), out.fileno(), out.fileno()))
    try:
        pid = answer["pid"]
        # Proven once the standby holds the streams (a standby still importing takes them when done).
        deadline = time.time() + 20
        while standby_token(task.pid, pid) is None and time.time() < deadline:
            time.sleep(0.05)
        assert standby_token(task.pid, pid) == "tok-one"
        assert standby_token(stranger.pid, pid) is None  # same token, another task's streams
        assert standby_token(task.pid, stranger.pid) is None  # not a session leader of its own
        assert standby_token(task.pid, task.pid) is None
        # An idle standby holds no task's streams: never adopted.
        assert all(standby_token(task.pid, idle) is None for idle in host.pool.idle_pids())
    finally:
        conn.close()
        for proc in (task, stranger):
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------ jobs on the real Slurm

def _job(job_id: str, tmp_path: Path, preload=("tw_slurm_probe",), fail=True, args="--enable-job-restart=True"):
    (tmp_path / "tw_slurm_probe.py").write_text(PROBE)
    (tmp_path / "job.py").write_text(JOB)
    definition = from_command([sys.executable, "job.py"], 2, args, job_id, stop_grace_s=2)
    # A workdir: the command comes wrapped in a shell (runtime.py), which task.py unwraps.
    return dataclasses.replace(definition, preload=tuple(preload), workdir=str(tmp_path),
                               env=(("PYTHONPATH", str(tmp_path)), ("TW_MARKS", str(tmp_path)),
                                    ("TW_FAIL", "1" if fail else "0")))


def _rank_lines(outcome) -> dict[tuple[int, int], dict]:
    found = {}
    for text in outcome.texts():
        if text.startswith("rank "):
            words = text.split()
            fields = dict(zip(words[::2], words[1::2]))
            found[(int(fields["rank"]), int(fields["round"]))] = fields
    return found


def _leftovers(tmp_path: Path) -> list[int]:
    """Processes of the job's environment (standbys, instances) or a host of its site."""
    mark = f"TW_MARKS={tmp_path}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _alive(int(entry.name)):
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if mark in environ or (b"standby_host" in cmdline and str(tmp_path).encode() in cmdline):
            found.append(int(entry.name))
    return found


def _manifests(tmp_path: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in (tmp_path / "slurm" / "manifests").glob(f"*.{kind}.json")]


def test_a_preloading_slurm_job_restarts_into_standbys_that_imported_before_the_fault(job_id, tmp_path):
    from tests.scenarios.runtimes import run

    outcome = run("slurm", tmp_path, _job(job_id, tmp_path), timeout_s=120)
    assert outcome.succeeded, outcome.texts()
    assert [(r[1], r[2]) for r in outcome.rows() if r[3] == "done"] == [("restart_job", "instance_exit")]
    lines = _rank_lines(outcome)
    assert sorted(lines) == [(0, 0), (0, 1), (1, 0), (1, 1)], outcome.texts()
    for key, fields in lines.items():
        assert (fields["preloaded"], fields["before_start"], fields["rank_at_import"]) == ("True", "True", "None"), key
        assert fields["cwd"] == str(tmp_path), key  # the workdir, without the shell
    failing_at = float(next(t for t in outcome.texts() if t.startswith("failing at ")).split()[-1])
    # The restart took spares, warm before the fault: not interpreters started for it.
    for rank in (0, 1):
        assert float(lines[(rank, 1)]["imported_at"]) < failing_at, lines
        assert lines[(rank, 1)]["pid"] != lines[(rank, 0)]["pid"]
    assert "ordinary process" not in "\n".join(outcome.texts())
    # The manifests name the standbys (adopted through their task wrappers) and the exits are as without preload.
    starts = _manifests(tmp_path, "start")
    assert sorted(str(m["pid"]) for m in starts) == sorted(f["pid"] for f in lines.values())
    assert all(m["task_pid"] and m["task_pid"] != m["pid"] for m in starts)
    exits = {(m["instance"], m["step_id"]): m["exit_code"] for m in _manifests(tmp_path, "exit")}
    first_step = min(step for _, step in exits)
    assert exits[("worker-1", first_step)] == 1 and exits[("worker-0", first_step)] in (-15, 143), exits
    assert [code for (_, step), code in exits.items() if step != first_step] == [0, 0], exits
    # What the instances wrote is in the tasks' output files, as before.
    written = "".join(p.read_text() for p in (tmp_path / "slurm" / "outputs").glob("*-step*-task*.out"))
    for (rank, round_) in lines:
        assert f"rank {rank} round {round_} pid" in written
    assert "Temporary failure in name resolution" in written
    deadline = time.time() + 15
    while _leftovers(tmp_path) and time.time() < deadline:
        time.sleep(0.2)
    assert _leftovers(tmp_path) == []


def test_without_a_host_the_tasks_start_fresh_and_say_why_once(job_id, tmp_path, monkeypatch):
    from tests.scenarios.runtimes import run
    from trainwarden.runtime.slurm.runtime import SlurmRuntime

    # The allocation never gets its hosts: the rounds start at once.
    monkeypatch.setattr(SlurmRuntime, "_hosts_ready", lambda self, job: True)
    definition = _job(job_id, tmp_path, args="--enable-job-restart=False")
    # It lives a moment: an agent adopts a task by reading its process (adopt.py), a task gone by then is lost.
    (tmp_path / "job.py").write_text("import os, sys, time\nprint('rank', os.environ['RANK'], 'preloaded',"
                                     " 'tw_slurm_probe' in sys.modules, flush=True)\ntime.sleep(1.5)\n")
    outcome = run("slurm", tmp_path, definition, timeout_s=90)
    assert outcome.succeeded, outcome.texts()
    texts = outcome.texts()
    for instance in ("worker-0", "worker-1"):
        said = [t for t in outcome.texts(instance) if "ordinary process" in t]
        assert len(said) == 1 and "no standby host listens on node" in said[0], texts
    assert sorted(t for t in texts if t.startswith("rank ")) == ["rank 0 preloaded False", "rank 1 preloaded False"]


C4D_ERROR = '[C4D] level=Error kind=RankCommHang rank=0 detail="allreduce stuck for 190 s"'


def test_a_requeued_allocation_gets_hosts_of_its_own_and_the_round_runs_in_their_standbys(job_id, tmp_path):
    from tests.scenarios.runtimes import run

    definition = _job(job_id, tmp_path, fail=False, args="--enable-job-hang-detection=True "
                      "--enable-c4d-hang-detection=True --enable-job-restart=True")
    # C4D blames rank 0's node: it is drained, and the next round needs a new allocation run without it.
    outcome = run("slurm", tmp_path, definition, timeout_s=150,
                  trigger=lambda line: C4D_ERROR if line.text.startswith("rank 0 round 0") else None)
    assert outcome.succeeded, outcome.texts()
    lines = _rank_lines(outcome)
    assert sorted(lines) == [(0, 0), (0, 1), (1, 0), (1, 1)], outcome.texts()
    for key, fields in lines.items():
        assert (fields["preloaded"], fields["before_start"], fields["rank_at_import"]) == ("True", "True", "None"), key
    starts = _manifests(tmp_path, "start")
    # Two allocations' rounds: the same job requeued (Slurm's restart count 0, then 1), or a job of its own
    # when the runtime saw the requeued one in a finished state and allocated anew (seen once in CI).
    rounds = {(m["job_id"], m["restart"]) for m in starts}
    assert len(rounds) == 2 and all(m["task_pid"] for m in starts), starts
    ready = sorted(p.name.split(".")[1] for p in (tmp_path / "slurm" / job_id / "standby").glob("*.ready"))
    assert ready == ["r0", "r0", "r1", "r1"], ready
    deadline = time.time() + 15
    while _leftovers(tmp_path) and time.time() < deadline:
        time.sleep(0.2)
    assert _leftovers(tmp_path) == []


ASYNC_JOB = textwrap.dedent("""\
    import glob, os, sys, time
    started = time.time()
    probe = sys.modules.get("tw_slurm_probe")
    rank, start = int(os.environ["RANK"]), int(os.environ["TRAINWARDEN_INSTANCE_RESTARTS"])
    marks = os.environ["TW_MARKS"]
    print(f"rank {rank} start {start} world {os.environ['WORLD_SIZE']} pid {os.getpid()}"
          f" preloaded {probe is not None} before_start {probe is not None and probe.IMPORTED_AT < started}",
          flush=True)
    open(os.path.join(marks, f"rank{rank}-start{start}"), "w").close()
    deadline = time.time() + 40
    if rank == 1 and start == 0:
        # Each node's host has a spare warm for the next incarnation (two imports per node) before the fault.
        while time.time() < deadline and len(glob.glob(os.path.join(marks, "imported-*"))) < 4:
            time.sleep(0.05)
        print("socket.gaierror: [Errno -3] Temporary failure in name resolution", file=sys.stderr, flush=True)
        sys.exit(1)
    if rank == 0:
        while time.time() < deadline and not os.path.exists(os.path.join(marks, "rank1-start1")):
            time.sleep(0.05)
    time.sleep(0.5)
""")


def test_an_instance_restarted_alone_in_a_preloading_async_job_runs_in_a_warm_standby(job_id, tmp_path):
    from tests.scenarios.runtimes import run

    definition = _job(job_id, tmp_path, args="--job-execution-mode=Async --enable-job-restart=True")
    (tmp_path / "job.py").write_text(ASYNC_JOB)
    outcome = run("slurm", tmp_path, definition, timeout_s=120)
    assert outcome.succeeded, outcome.texts()
    assert [(r[1], r[5]) for r in outcome.rows() if r[3] == "done"] == [("restart_instance", "worker-1")]
    said = {}
    for text in outcome.texts():
        if text.startswith("rank "):
            words = text.split()
            said[(int(words[1]), int(words[3]))] = dict(zip(words[4::2], words[5::2]))
    assert sorted(said) == [(0, 0), (1, 0), (1, 1)], outcome.texts()
    for key, fields in said.items():
        assert (fields["world"], fields["preloaded"], fields["before_start"]) == ("2", "True", "True"), key
    assert "ordinary process" not in "\n".join(outcome.texts())
    # The lone task is a step of its own, adopted through its wrapper like the round's.
    starts = _manifests(tmp_path, "start")
    assert sorted((m["instance"], m["task_id"]) for m in starts) == [("worker-0", 0), ("worker-1", 0), ("worker-1", 1)]
    assert len({m["step_id"] for m in starts}) == 2 and all(m["task_pid"] != m["pid"] for m in starts)
