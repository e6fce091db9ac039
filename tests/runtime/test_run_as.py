"""Instances as another user (runtime/run_as.py): --run-as parsed and checked
strictly; the local runtime and its standbys start processes with that uid,
its group and no supplementary groups, and can still stop them."""

from __future__ import annotations

import os
import pwd
import signal
import time

import pytest

from tests.other_user import OTHER_GID, OTHER_UID, other_python, python_path
from trainwarden.events import InstanceExited, InstanceStarted, LogLine
from trainwarden.runtime import run_as as run_as_module
from trainwarden.runtime.local import LocalRuntime
from trainwarden.runtime.run_as import RunAs, RunAsError, parse_run_as, resolve
from trainwarden.runtime.standby import python_invocation
from trainwarden.runtime.standby_pool import StandbyPool

OTHER = RunAs(OTHER_UID, OTHER_GID, "nobody", "/nonexistent")


def _known(uid: int):
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def test_a_user_is_given_by_name_by_uid_or_by_uid_and_gid():
    root = pwd.getpwuid(0)
    assert parse_run_as(root.pw_name) == RunAs(0, root.pw_gid, root.pw_name, root.pw_dir)
    assert parse_run_as("0").uid == 0
    # A uid the password database does not know takes its own number for a group, unless one is given.
    unknown = next(uid for uid in range(54321, 54400) if _known(uid) is None)
    assert parse_run_as(str(unknown)) == RunAs(unknown, unknown)
    assert parse_run_as(f" {unknown}:4343 ") == RunAs(unknown, 4343)


@pytest.mark.parametrize("text, message", [
    ("no-such-user-here", "there is no user named 'no-such-user-here' on this machine"),
    ("1000:abc", "is neither a user name nor UID[:GID]"),
    ("-1", "is neither a user name nor UID[:GID]"),
    ("bob;rm -rf /", "is neither a user name nor UID[:GID]"),
    ("4294967295", "beyond the largest uid or gid"),
])
def test_a_user_that_cannot_be_is_refused_saying_why(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_run_as(text)


def test_the_supervisors_own_user_root_or_a_supervisor_that_is_not_root_is_refused(monkeypatch):
    with pytest.raises(RunAsError, match="--run-as root would give the jobs the supervisor's own power"):
        resolve("0")
    monkeypatch.setattr(run_as_module.os, "geteuid", lambda: 1000)
    with pytest.raises(RunAsError, match="the supervisor's own user, who can read its key") as caught:
        resolve("1000")
    assert "e.g. nobody" in caught.value.hint
    with pytest.raises(RunAsError, match="needs the supervisor to run as root"):
        resolve("1001")
    monkeypatch.setattr(run_as_module.os, "getegid", lambda: 4000)
    with pytest.raises(RunAsError, match="has the supervisor's own group, which may read its key"):
        resolve("1001:4000")
    with pytest.raises(RunAsError, match="--run-as: there is no user named 'nobody-at-all'"):
        resolve("nobody-at-all")


def test_home_user_and_logname_are_the_users_where_the_job_inherited_the_supervisors():
    supervisor = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": "/bin"}
    job_set_home = {**supervisor, "HOME": "/data/job"}
    assert OTHER.environment(supervisor, supervisor) == {"HOME": "/nonexistent", "USER": "nobody",
                                                         "LOGNAME": "nobody", "PATH": "/bin"}
    assert OTHER.environment(job_set_home, supervisor)["HOME"] == "/data/job"
    assert RunAs(54321, 54321).environment(supervisor, supervisor) == supervisor  # no entry: nothing to say


# ------------------------------------------------------------ real processes (root only)


def _runtime(events: list, **options) -> LocalRuntime:
    return LocalRuntime("job-run-as", events.append, "n1", run_as=OTHER, **options)


def _wait(events: list, kind, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in events if isinstance(e, kind)]
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no {kind.__name__} in {timeout_s:.0f} s: {events}")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": python_path()}


IDENTITY = "import os; print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.environ['HOME'], flush=True)"


def test_an_instance_runs_as_the_user_with_its_group_and_no_other_groups():
    python = other_python()
    events: list = []
    runtime = _runtime(events)
    try:
        runtime.start("worker-0", [python, "-c", IDENTITY], _env(), None, 0, 0)
        [exited] = _wait(events, InstanceExited)
        lines = [e.text for e in events if isinstance(e, LogLine)]
        assert exited.exit_code == 0, lines
        assert lines == [f"{OTHER_UID} {OTHER_UID} {OTHER_GID} [] /nonexistent"]
    finally:
        runtime.close(1.0)


def test_the_supervisor_still_stops_and_kills_what_runs_as_the_other_user():
    python = other_python()
    events: list = []
    runtime = _runtime(events)
    try:
        # Ignores SIGTERM: only the SIGKILL after the grace period ends it.
        pid = runtime.start("worker-0", [python, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                                       "signal.SIG_IGN); print('up', flush=True); time.sleep(600)"],
                            _env(), None, 0, 0)
        _wait(events, LogLine)
        assert _uid_of(pid) == OTHER_UID
        began = time.monotonic()
        runtime.stop(["worker-0"], 0.5)
        assert time.monotonic() - began < 10
        [exited] = _wait(events, InstanceExited)
        assert exited.exit_code == 128 + signal.SIGKILL
    finally:
        runtime.close(0.5)


def _uid_of(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    raise AssertionError(f"no Uid line for {pid}")


def test_a_standby_becomes_an_instance_of_the_other_user_and_still_learns_what_it_imports(tmp_path):
    python = other_python()
    pool = StandbyPool(("email",), spawn_argv=list, on_spawn=lambda pid: None, say=print, run_as=OTHER,
                       spares_after_s=0.0, spares_after_learning_s=0.0)
    try:
        code = IDENTITY + "; import email.mime.text; print('standby', 'standby.py' in open('/proc/self/cmdline').read())"
        invocation, why = python_invocation([python, "-c", code])
        assert invocation is not None, why
        env = _env()
        standby = pool.take("worker-0", invocation, env, "/", "TRAINWARDEN_PROCESS_MARK", "mark")
        assert standby is not None
        assert _uid_of(standby.popen.pid) == OTHER_UID
        standby.hand_over(invocation, env, "/")
        out, err = standby.popen.communicate(timeout=60)
        assert standby.popen.returncode == 0, err
        assert out.decode().splitlines() == [f"{OTHER_UID} {OTHER_UID} {OTHER_GID} [] {env['HOME']}", "standby True"]
        # What it loaded lazily under the preload package reached the pool, written as the other user.
        deadline = time.monotonic() + 10
        while pool.counters["learned"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.counters["learned"] > 0
    finally:
        pool.close()


def test_a_learn_file_the_job_replaced_by_a_fifo_or_a_link_is_skipped_without_blocking(tmp_path):
    pool = StandbyPool(("email",), spawn_argv=list, on_spawn=lambda pid: None, say=print)
    try:
        os.mkfifo(pool.learn_path("fifo"))
        (tmp_path / "modules").write_text("email.mime\n")
        os.symlink(tmp_path / "modules", pool.learn_path("link"))
        began = time.monotonic()
        assert pool._read_learned("fifo") == 0 and pool._read_learned("link") == 0
        assert time.monotonic() - began < 1.0
    finally:
        pool.close()


def test_an_instance_the_user_cannot_execute_exits_126_as_a_shell_says(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("jobs run as another user only under a supervisor that runs as root")
    program = tmp_path / "private.sh"  # under pytest's 0700 tree: the other user cannot reach it
    program.write_text("#!/bin/sh\necho never\n")
    program.chmod(0o700)
    events: list = []
    runtime = _runtime(events)
    try:
        runtime.start("worker-0", [str(program)], _env(), None, 0, 0)
        [exited] = _wait(events, InstanceExited)
        assert exited.exit_code == 126
        assert [e for e in events if isinstance(e, InstanceStarted)]
    finally:
        runtime.close(0.5)
