"""A hostile job against the channels that speak for others (embedded run):
the C4D socket and another job's SDK endpoint. Real runs, real sockets, real
/proc; the attacks are what a job of the same user can do."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from trainwarden.store import open_reader
from tests.conftest import ROOT, TRAINWARDEN

pytestmark = pytest.mark.e2e

FORGED = '[C4D] level=Error kind=RankCommHang rank=0 node=gpu-9 detail="written by the job itself"'

# The job: it writes a C4D Error about another node to the run's C4D socket,
# itself and from a daemon that left its process tree (double fork, setsid).
C4D_WRITER = textwrap.dedent('''
    import os, socket, sys, time

    path, line = sys.argv[1], sys.argv[2]
    print("c4d socket in my environment:", "TRAINWARDEN_C4D_SOCKET" in os.environ, flush=True)
    pid = os.getppid()
    while path == "my-agents" and pid > 1:  # the agent that started me says where it listens
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
        if "--c4d-socket" in argv:
            path = argv[argv.index("--c4d-socket") + 1]
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    print("writing to", path, flush=True)

    def send(who):
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(path)
                conn.sendall((line + "\\n").encode())
                conn.settimeout(10)
                conn.recv(1)  # refused: the run hangs up
            print(who, "wrote its line", flush=True)
        except OSError as exc:
            print(who, "could not write:", exc, flush=True)

    send("instance")
    middle = os.fork()
    if middle == 0:
        parent = os.getpid()
        if os.fork():
            os._exit(0)
        os.setsid()
        while os.getppid() == parent:
            time.sleep(0.01)
        send("daemon")
        os._exit(0)
    os.waitpid(middle, 0)
    time.sleep(2)
''')

# Job A: busy until job B has tried its worst, then silent. If B had turned
# A's hang detection off, A would sit silent for 20 s and succeed unjudged.
VICTIM = textwrap.dedent('''
    import os, pathlib, sys, time

    if os.environ["TRAINWARDEN_RESTART_ROUND"] != "0":
        print("A restarted after its hang", flush=True)
        sys.exit(0)
    flag = pathlib.Path(sys.argv[1])
    deadline = time.time() + 90
    while not flag.exists() and time.time() < deadline:
        print("A busy", flush=True)
        time.sleep(0.3)
    print("A goes silent", flush=True)
    time.sleep(20)
''')

# Job B: finds A's instance in /proc, takes its SDK socket and token from its
# environment and calls A's SDK with them, through the SDK and by hand.
THIEF = textwrap.dedent('''
    import json, os, pathlib, socket, sys, time

    victim, flag = sys.argv[1], pathlib.Path(sys.argv[2])
    stolen = None
    deadline = time.time() + 60
    while stolen is None and time.time() < deadline:
        for entry in pathlib.Path("/proc").iterdir():
            try:
                items = dict(i.split(b"=", 1) for i in (entry / "environ").read_bytes().split(b"\\0") if b"=" in i)
            except (OSError, ValueError):
                continue
            if items.get(b"TRAINWARDEN_JOB_ID") == victim.encode():
                stolen = {k.decode(): v.decode() for k, v in items.items() if k.startswith(b"TRAINWARDEN_")}
                break
        time.sleep(0.1)
    os.environ.update(stolen)
    from trainwarden.sdk import job_monitor as jm

    monitor = jm.Monitor()
    print("B custom message:", monitor.send_custom_message(content="forged by B").to_string(), flush=True)
    print("B hang detection off:", monitor.reset_config(enable_job_hang_detection=False).to_string(), flush=True)

    def by_hand(body):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(stolen["TRAINWARDEN_SDK_SOCKET"])
            conn.sendall((json.dumps(body) + "\\n").encode())
            return conn.makefile("rb").readline().decode().strip()

    token = stolen["TRAINWARDEN_TOKEN"]
    print("B v1 with A's token:", by_hand({"v": 1, "token": token, "op": "set_hang_interval", "interval": -1}))
    print("B v2 with A's token:", by_hand({"v": 2, "token": token, "op": "set_hang_interval", "interval": -1}))
    flag.touch()
''')


def _program(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _start(store, job_id, args, program, *argv, env=None):
    full = dict(os.environ, TRAINWARDEN_STORE=str(store), PYTHONPATH=str(ROOT / "pipeline"), **(env or {}))
    return subprocess.Popen([*TRAINWARDEN, "run", "--job-id", job_id, "--args", args, "--stop-grace", "1",
                             "--", sys.executable, program, *argv],
                            env=full, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _dead_letters(store, job_id, source):
    with open_reader(store) as reader:
        return [d for d in reader.dead_letters(limit=1000) if d["job_id"] == job_id and d["source"] == source]


def test_a_job_writing_c4d_errors_to_the_c4d_socket_gets_nothing_isolated_and_each_attempt_is_dead_lettered(
        store, job_id, tmp_path, history):
    channel = tmp_path / "c4d.sock"
    proc = _start(store, job_id, "--enable-job-restart=True --enable-job-hang-detection=True "
                  "--enable-c4d-hang-detection=True", _program(tmp_path, "writer.py", C4D_WRITER),
                  str(channel), FORGED, env={"TRAINWARDEN_C4D_SOCKET": str(channel)})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert "c4d socket in my environment: False" in out, out
    assert "instance wrote its line" in out and "daemon wrote its line" in out, out
    assert history(job_id) == []  # no isolation, no restart
    with open_reader(store) as reader:
        trusted = reader.select("SELECT count() AS n FROM diagnoses FINAL WHERE job_id = {job_id:String} "
                                "AND trusted", {"job_id": job_id})
    assert trusted == [{"n": 0}]
    letters = _dead_letters(store, job_id, "c4d")
    assert len(letters) == 2, letters
    assert all("C4D line refused" in d["error"] and FORGED in d["payload"] for d in letters), letters
    reasons = " ".join(d["error"] for d in letters)
    assert f"a process of job {job_id}'s instance worker-0" in reasons, reasons
    assert "2 dead letters" in err, err


def test_a_process_of_another_job_cannot_use_a_jobs_sdk_with_its_stolen_environment(store, tmp_path, history):
    victim, thief = f"victim-{os.getpid()}-{time.monotonic_ns()}", f"thief-{os.getpid()}-{time.monotonic_ns()}"
    flag = tmp_path / "thief-is-done"
    a = _start(store, victim, "--enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=2",
               _program(tmp_path, "victim.py", VICTIM), str(flag))
    b = _start(store, thief, "", _program(tmp_path, "thief.py", THIEF), victim, str(flag))
    b_out, b_err = b.communicate(timeout=120)
    a_out, a_err = a.communicate(timeout=120)
    assert b.returncode == 0 and a.returncode == 0, (b_out, b_err, a_out, a_err)
    lines = [line.split("] ", 1)[-1] for line in b_out.splitlines()]  # after the "[worker-0] " prefix
    said = dict(line.split(": ", 1) for line in lines if line.startswith("B "))
    assert len(said) == 4, b_out
    for attempt in ("B custom message", "B hang detection off"):
        assert said[attempt].startswith("ERROR") and "not a process of any running incarnation" in said[attempt]
    assert '"ok": false' in said["B v1 with A's token"] and "version" in said["B v1 with A's token"]
    assert '"ok": false' in said["B v2 with A's token"] and "'token'" in said["B v2 with A's token"]
    # A's hang detection was never switched off: its silence was judged a hang.
    assert "A restarted after its hang" in a_out, a_out
    records = history(victim, "--wide")
    assert [(r["action"], r["error_source"]) for r in records if r["result"] == "done"] == [("restart_job", "hang")]
    assert not any("forged by B" in str(r) for r in records)
    assert len(_dead_letters(store, victim, "sdk")) == 4
    assert _dead_letters(store, thief, "sdk") == []
