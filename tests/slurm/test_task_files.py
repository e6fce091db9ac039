"""TaskFiles on files a test writes, and task.py run directly with fake SLURM_* variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainwarden.runtime.slurm.files import TRUNCATED, TaskExited, TaskFiles, TaskLines, TaskStarted
from trainwarden.runtime.slurm.task import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


def manifest(d: Path, stem: str, **fields) -> None:
    write_json_atomic(d / f"{stem}.json", fields)


def start(d: Path, out: Path, *, job=7, step=0, task=0, node="n1", instance="w0", restart=0, offset=0) -> str:
    stem = f"{job}.{step}.{task}" + (f".r{restart}" if restart else "")
    manifest(d, f"{stem}.start", job_id=job, step_id=step, task_id=task, restart=restart, node=node,
             instance=instance, pid=123, output=str(out), output_offset=offset)
    return stem


def lines_of(events) -> list[str]:
    return [line for e in events if isinstance(e, TaskLines) for line in e.lines]


def test_partial_lines_bad_bytes_and_exit(tmp_path):
    out = tmp_path / "7-step0-task0.out"
    out.write_bytes(b"")
    stem = start(tmp_path, out)
    files = TaskFiles(tmp_path, "n1")
    events = files.poll()
    assert events == [TaskStarted(7, 0, 0, "n1", "w0", 123, str(out), 0)]
    with open(out, "ab") as f:
        f.write(b"one\r\ntw")
    assert lines_of(files.poll()) == ["one"]
    with open(out, "ab") as f:
        f.write(b"o\nbad \xff\xfe bytes\nlast without newline")
    assert lines_of(files.poll()) == ["two", "bad \ufffd\ufffd bytes"]
    assert files.poll() == []  # the partial line waits for its newline or the exit
    manifest(tmp_path, f"{stem}.exit", exit_code=-15)
    with open(out, "ab") as f:
        f.write(b" and more")  # written before the exit manifest was read: still reported
    events = files.poll()
    assert lines_of(events) == ["last without newline and more"]
    assert events[-1] == TaskExited(7, 0, 0, "w0", -15, 0)
    assert events[-1].shell_code == 143
    assert files.running == [] and files.poll() == []


def test_huge_lines_are_truncated(tmp_path):
    out = tmp_path / "7-step0-task0.out"
    out.write_bytes(b"x" * 100 + b"\n" + "é".encode() * 40 + b"\n")
    stem = start(tmp_path, out)
    files = TaskFiles(tmp_path, "n1", max_line_bytes=15)
    got = lines_of(files.poll())
    assert got == ["x" * 15 + TRUNCATED, "é" * 7 + TRUNCATED]  # no broken character at the cut
    # a huge partial line is reported at once, its rest dropped up to the newline
    with open(out, "ab") as f:
        f.write(b"y" * 40)
    assert lines_of(files.poll()) == ["y" * 15 + TRUNCATED]
    with open(out, "ab") as f:
        f.write(b"y" * 40 + b"\nafter\n")
    assert lines_of(files.poll()) == ["after"]
    manifest(tmp_path, f"{stem}.exit", exit_code=0)
    assert [type(e) for e in files.poll()] == [TaskExited]


def test_other_nodes_bad_manifests_and_requeue_offset(tmp_path):
    out0, out1 = tmp_path / "7-step0-task0.out", tmp_path / "7-step0-task1.out"
    out0.write_bytes(b"old run\nnew run\n")
    out1.write_bytes(b"other node\n")
    start(tmp_path, out0, restart=1, offset=len(b"old run\n"))
    start(tmp_path, out1, task=1, node="n2", instance="w1")
    (tmp_path / "9.0.0.start.json").write_text("{not json")
    (tmp_path / "9.0.1.start.json").write_text(json.dumps({"job_id": 9, "node": "n1"}))
    (tmp_path / "9.0.2.start.json").write_text(json.dumps([1, 2]))
    files = TaskFiles(tmp_path, "n1")
    events = files.poll()
    assert [e.instance for e in events if isinstance(e, TaskStarted)] == ["w0"]
    assert events[0].restart == 1
    assert lines_of(events) == ["new run"]  # nothing before the recorded offset
    assert files.rejected == 3
    (tmp_path / "7.0.0.r1.exit.json").write_text("{}")  # exit manifest without exit_code
    assert files.poll() == [] and files.rejected == 4
    assert files.poll() == [] and files.rejected == 4  # counted once
    assert len(files.running) == 1


# ---------------------------------------------------------------- task.py


def slurm_env(tmp_path: Path, procid: int = 0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(
        PYTHONPATH=str(ROOT / "pipeline"),
        SLURM_JOB_ID="42",
        SLURM_STEP_ID="3",
        SLURM_PROCID=str(procid),
        SLURM_LOCALID="0",
        SLURM_NODEID=str(procid),
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NUM_NODES="2",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_STEP_NODELIST="n[1-2]",
        SLURMD_NODENAME=f"n{procid + 1}",
        PATH="/nonexistent-bin:" + env.get("PATH", ""),  # no scontrol needed: master_addr is given
    )
    return env


def write_plan(tmp_path: Path, code: str, **extra) -> Path:
    plan = {
        "instances": [
            {"name": f"worker-{i}", "command": [sys.executable, "-c", code], "env": {"WHO": f"w{i}"}} for i in range(2)
        ],
        "master_addr": "10.1.2.3",
        "master_port": 29555,
        "manifest_dir": str(tmp_path / "man"),
        "output_dir": str(tmp_path / "out"),
        **extra,
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def run_task(plan: Path, env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainwarden.runtime.slurm.task", str(plan)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def test_task_runs_instance_with_torch_env_and_propagates_exit(tmp_path):
    code = "import os,sys; print(os.environ['WHO'], os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], os.environ['LOCAL_WORLD_SIZE']); sys.exit(3)"
    plan = write_plan(tmp_path, code)
    proc = run_task(plan, slurm_env(tmp_path, procid=1))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert out.strip() == "w1 1 2 10.1.2.3 29555 1"
    man = tmp_path / "man"
    st = json.loads((man / "42.3.1.start.json").read_text())
    assert st["node"] == "n2" and st["instance"] == "worker-1" and st["task_id"] == 1 and st["step_id"] == 3
    assert st["output"] == str(tmp_path / "out" / "42-step3-task1.out") and isinstance(st["pid"], int)
    assert json.loads((man / "42.3.1.exit.json").read_text())["exit_code"] == 3
    assert [p.name for p in man.iterdir() if p.name.startswith(".")] == []  # no temporary files left


def test_task_forwards_sigterm_to_the_command_group(tmp_path):
    code = (
        "import signal, subprocess, sys, time\n"
        "kid = subprocess.Popen(['sleep', '60'])\n"  # a grandchild in the same group
        "signal.signal(signal.SIGTERM, lambda *a: (print('got term', flush=True), kid.wait(), sys.exit(7)))\n"
        "print(kid.pid, flush=True)\n"  # only once the handler is in place: the test's SIGTERM follows at once
        "time.sleep(60)\n"
    )
    plan = write_plan(tmp_path, code)
    proc = run_task(plan, slurm_env(tmp_path), start_new_session=True)
    grandchild = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7, err
    assert "got term" in out
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
    assert json.loads((tmp_path / "man" / "42.3.0.exit.json").read_text())["exit_code"] == 7


def test_task_reports_death_by_signal(tmp_path):
    plan = write_plan(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    proc = run_task(plan, slurm_env(tmp_path))
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + 9
    assert json.loads((tmp_path / "man" / "42.3.0.exit.json").read_text())["exit_code"] == -9


@pytest.mark.parametrize(
    "content",
    [
        "{broken",
        json.dumps({"instances": []}),
        json.dumps({"instances": [{"name": "w", "command": "not a list"}], "manifest_dir": "/tmp", "output_dir": "/tmp"}),
        json.dumps({"instances": [{"name": "w", "command": ["true"]}], "manifest_dir": "/tmp", "output_dir": "/tmp"}),  # task 1 of 1
        None,  # no such file
    ],
)
def test_bad_plan_exits_2_with_one_line(tmp_path, content):
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    proc = run_task(plan, slurm_env(tmp_path, procid=1))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainwarden-slurm-task:"), err


def test_missing_command_exits_127_with_manifests(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"instances": [{"name": "w", "command": ["/no/such/binary"]}], "master_addr": "h",
                                "manifest_dir": str(tmp_path / "man"), "output_dir": str(tmp_path / "out")}))
    proc = run_task(plan, slurm_env(tmp_path))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 127 and "cannot start" in err
    files = TaskFiles(tmp_path / "man", "n1")
    events = files.poll()
    assert isinstance(events[0], TaskStarted) and events[0].pid is None
    assert isinstance(events[-1], TaskExited) and events[-1].exit_code == 127


def test_a_manifest_naming_a_file_that_is_not_its_tasks_output_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the signing key\n")
    outputs, manifests = tmp_path / "outputs", tmp_path / "manifests"
    outputs.mkdir()
    manifests.mkdir()
    start(manifests, secret)  # a job's user wrote this manifest: it names a file srun never wrote
    files = TaskFiles(manifests, "n1", output_dir=outputs)
    assert files.poll() == [] and files.rejected == 1


def test_a_tasks_output_replaced_by_a_symbolic_link_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the signing key\n")
    outputs, manifests = tmp_path / "outputs", tmp_path / "manifests"
    outputs.mkdir()
    manifests.mkdir()
    out = outputs / "7-step0-task0.out"
    out.symlink_to(secret)  # the job's user owns outputs/: it may plant a link under the right name
    stem = start(manifests, out)
    files = TaskFiles(manifests, "n1", output_dir=outputs)
    assert [type(e).__name__ for e in files.poll()] == ["TaskStarted"]
    manifest(manifests, f"{stem}.exit", exit_code=0)
    assert lines_of(files.poll()) == []
