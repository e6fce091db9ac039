"""Pre-warmed interpreters (runtime/standby.py, runtime/standby_pool.py) on
real processes: a standby that imported the preload modules becomes the
instance and behaves as ``python`` would."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trainwarden.runtime.standby import python_invocation
from trainwarden.runtime.standby_pool import StandbyPool

MARK = "TRAINWARDEN_PROCESS_MARK"


@pytest.mark.parametrize("command,expected", [
    (["python", "train.py", "--lr", "1"], {"script": "train.py", "argv": ("train.py", "--lr", "1")}),
    (["/usr/bin/python3.11", "-u", "train.py"], {"script": "train.py", "unbuffered": True}),
    (["python3", "-uB", "-m", "pkg.main", "x"], {"module": "pkg.main", "argv": ("pkg.main", "x"),
                                                  "no_bytecode": True}),
    (["python", "-c", "print(1)", "a"], {"code": "print(1)", "argv": ("-c", "a")}),
])
def test_a_python_command_line_is_read_as_the_interpreter_reads_it(command, expected):
    invocation, why = python_invocation(command)
    assert why == "" and invocation is not None
    for field, value in expected.items():
        assert getattr(invocation, field) == value


@pytest.mark.parametrize("command,why", [
    (["bash", "-c", "python train.py"], "is not a Python interpreter"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "is not a Python interpreter"),
    (["python", "-O", "train.py"], "option -O needs a fresh interpreter"),
    (["python", "-X", "dev", "train.py"], "option -X needs a fresh interpreter"),
    (["python"], "interactive"),
    (["python", "-", "x"], "standard input"),
])
def test_a_command_a_standby_cannot_run_is_refused_with_the_reason(command, why):
    invocation, reason = python_invocation(command)
    assert invocation is None and why in reason


@pytest.fixture
def pool():
    said: list[str] = []
    pools: list[StandbyPool] = []

    def make(modules=("json",), spares_after_s=0.0, spares_after_learning_s=0.0):
        made = StandbyPool(modules, spawn_argv=list, on_spawn=lambda pid: None, say=said.append,
                           spares_after_s=spares_after_s, spares_after_learning_s=spares_after_learning_s)
        made.said = said
        pools.append(made)
        return made

    yield make
    for made in pools:
        made.close()


def _run(pool, command, env, cwd, timeout=60, instance="worker-0"):
    invocation, why = python_invocation(command)
    assert invocation is not None, why
    standby = pool.take(instance, invocation, env, str(cwd), MARK, "test-mark")
    assert standby is not None, pool.said
    standby.hand_over(invocation, env, str(cwd))
    out, err = standby.popen.communicate(timeout=timeout)
    return standby.popen.returncode, out.decode(), err.decode()


def _env(tmp_path, **extra):
    return {**os.environ, "PYTHONPATH": str(tmp_path), "RANK": "1", MARK: "incarnation-mark", **extra}


def test_a_standby_becomes_the_instance_with_its_argv_main_cwd_and_environment(pool, tmp_path):
    (tmp_path / "heavy.py").write_text("import os\nSEEN_AT_IMPORT = os.environ.get('RANK')\n")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import os, sys, heavy
        print("argv", sys.argv, "name", __name__, "cwd", os.getcwd())
        print("rank", os.environ["RANK"], "rank at import", heavy.SEEN_AT_IMPORT)
        print("preloaded before main", "heavy" in sys.modules)
        print("path0", sys.path[0])
    """))
    code, out, err = _run(pool(("heavy",)), [sys.executable, str(tmp_path / "train.py"), "--lr", "3"],
                          _env(tmp_path), work)
    assert code == 0, err
    assert f"argv ['{tmp_path / 'train.py'}', '--lr', '3'] name __main__ cwd {work}" in out
    # The module was imported by the standby, before any instance existed.
    assert "rank 1 rank at import None" in out
    assert f"path0 {tmp_path}" in out


def test_exit_codes_and_tracebacks_are_those_of_a_fresh_interpreter(pool, tmp_path):
    made = pool()
    cases = {
        "import sys; sys.exit(3)": 3,
        "import sys; sys.exit('bad config')": 1,
        "raise ValueError('shape mismatch')": 1,
        "print('done')": 0,
    }
    for source, expected in cases.items():
        script = tmp_path / "job.py"
        script.write_text(source + "\n")
        code, out, err = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
        fresh = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
        assert code == fresh.returncode == expected, (source, err)
        assert err == fresh.stderr, (source, err, fresh.stderr)  # the same traceback: no standby frames
        assert out == fresh.stdout


def test_modules_and_inline_code_run_as_python_m_and_python_c_do(pool, tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("import sys\nprint('module', __name__, sys.argv)\n")
    made = pool()
    code, out, _ = _run(made, [sys.executable, "-m", "pkg.main", "x"], _env(tmp_path), tmp_path)
    assert code == 0 and f"module __main__ ['{package / 'main.py'}', 'x']" in out
    code, out, _ = _run(made, [sys.executable, "-c", "import sys; print('code', __name__, sys.argv)", "y"],
                        _env(tmp_path), tmp_path)
    assert code == 0 and "code __main__ ['-c', 'y']" in out


def test_an_instance_killed_by_a_signal_dies_of_it_as_a_fresh_process_does(pool, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    code, _, err = _run(pool(), [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == -signal.SIGINT and "KeyboardInterrupt" in err


def test_atexit_handlers_and_threads_finish_before_the_instance_exits(pool, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import atexit, threading, time
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
        raise SystemExit(4)
    """))
    code, out, _ = _run(pool(), [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == 4 and out.index("thread done") < out.index("atexit ran")


def test_a_preload_that_fails_still_runs_the_instance_then_means_ordinary_starts_said_once(pool, tmp_path):
    made = pool(("no_such_module_for_trainwarden",))
    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    # The first standby was handed its instance before its imports ended: it runs it as python would.
    code, out, err = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert (code, out, err) == (0, "ran\n", "")
    invocation, _ = python_invocation([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while made.take("worker-0", invocation, _env(tmp_path), str(tmp_path), MARK, "m") is not None:
        assert time.monotonic() < deadline, made.said
        time.sleep(0.2)
    assert made.take("worker-0", invocation, _env(tmp_path), str(tmp_path), MARK, "m") is None
    said = [text for text in made.said if "preloading no_such_module_for_trainwarden failed" in text]
    assert len(said) == 1 and "No module named 'no_such_module_for_trainwarden'" in said[0], made.said


def test_a_round_takes_one_standby_per_instance_without_waiting_for_imports(pool, tmp_path):
    slow = tmp_path / "slow_import.py"
    slow.write_text("import time\ntime.sleep(2)\n")
    made = pool(("slow_import",))
    invocation, _ = python_invocation([sys.executable, "-c", "pass"])
    started = time.monotonic()
    taken = [made.take(f"worker-{i}", invocation, _env(tmp_path), str(tmp_path), MARK, "m") for i in range(3)]
    assert all(taken) and time.monotonic() - started < 1.5  # three imports of 2 s each were not waited for
    for standby in taken:
        standby.hand_over(invocation, _env(tmp_path), str(tmp_path))
        standby.popen.communicate(timeout=60)
    # One spare per instance, for the next round.
    deadline = time.monotonic() + 30
    while len(made.idle_pids()) < 3:
        assert time.monotonic() < deadline, made.idle_pids()
        time.sleep(0.1)
    assert len(made.idle_pids()) == 3


def test_every_take_leaves_a_warm_successor_and_close_ends_the_idle_ones(pool, tmp_path):
    made = pool()
    script = tmp_path / "job.py"
    script.write_text("print('ok')\n")
    _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    deadline_pids = made.idle_pids()
    for _ in range(100):
        if deadline_pids:
            break
        time.sleep(0.1)
        deadline_pids = made.idle_pids()
    assert len(deadline_pids) == 1
    # The successor is used by the next start: no new interpreter is waited for.
    code, out, _ = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == 0 and made.counters["taken"] == 2
    idle = made.idle_pids()
    made.close()
    for pid in idle:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_what_an_instance_imports_lazily_under_a_preload_package_is_imported_by_the_next_standbys(pool, tmp_path):
    package = tmp_path / "twheavy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # As torch leaves torch._dynamo to the first optimizer.
    (package / "lazy.py").write_text("import time\ntime.sleep(1.5)\n")
    (package / "__main__.py").write_text("raise SystemExit('never run by a standby')\n")
    (tmp_path / "elsewhere.py").write_text("")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import sys, time
        print("lazy before start", "twheavy.lazy" in sys.modules, flush=True)
        started = time.monotonic()
        import twheavy.lazy, elsewhere
        print(f"lazy import took {time.monotonic() - started:.2f}", flush=True)
    """))
    made = pool(("twheavy",))
    code, out, err = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == 0 and "lazy before start False" in out, (out, err)
    # The spare that waits was told to import it as well (within a few refreshes).
    deadline = time.monotonic() + 20
    while made.counters["learned"] < 1:
        assert time.monotonic() < deadline, made.counters
        time.sleep(0.1)
    time.sleep(3.0)
    code, out, err = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == 0 and "lazy before start True" in out, (out, err)
    assert "lazy import took 0.0" in out, out
    # Only modules under the preload packages: not the job's own, never a __main__.
    assert made.counters["learned"] == 1, made.counters


def test_a_learn_file_the_job_forged_gives_only_valid_names_under_the_preload_packages(pool, tmp_path):
    made = pool(("json",))
    invocation, _ = python_invocation([sys.executable, "-c", "pass"])
    env = _env(tmp_path)
    taken = made.take("worker-0", invocation, env, str(tmp_path), MARK, "m")
    path = taken.learn
    taken.close()
    with open(path, "wb") as f:
        f.write(b"json.tool\nos\njson.__main__\njson; import os\n\xff\xfe\n" + b"json." + b"a" * 300 + b"\njson.decoder\npartial")
    deadline = time.monotonic() + 10
    while made.counters["learned"] < 2:
        assert time.monotonic() < deadline, made.counters
        time.sleep(0.1)
    time.sleep(1.5)
    key = os.path.basename(path)[:-len(".modules")]
    assert made._learned[key] == ["json.tool", "json.decoder"]


def test_in_streams_mode_the_instance_writes_to_the_stdout_and_stderr_it_brought(tmp_path):
    made = StandbyPool(("json",), spawn_argv=list, on_spawn=lambda pid: None, say=print, streams=True,
                       spares_after_s=0.0)
    try:
        script = tmp_path / "job.py"
        script.write_text("import sys\nprint('to the task file')\nprint('err line', file=sys.stderr)\nsys.exit(4)\n")
        invocation, _ = python_invocation([sys.executable, str(script)])
        env = _env(tmp_path)
        standby = made.take("worker-0", invocation, env, str(tmp_path), MARK, "m")
        out_path, err_path = tmp_path / "task.out", tmp_path / "task.err"
        with open(os.devnull, "rb") as stdin, open(out_path, "ab") as out, open(err_path, "ab") as err:
            standby.hand_over(invocation, env, str(tmp_path), streams=(stdin.fileno(), out.fileno(), err.fileno()))
        assert standby.popen.wait(60) == 4
        assert out_path.read_text() == "to the task file\n"
        assert err_path.read_text() == "err line\n"
    finally:
        made.close()


def test_spares_are_prepared_only_once_the_starts_have_been_quiet_for_a_while(pool, tmp_path):
    made = pool(spares_after_s=2.0)
    invocation, _ = python_invocation([sys.executable, "-c", "pass"])
    taken = [made.take(f"worker-{i}", invocation, _env(tmp_path), str(tmp_path), MARK, "m") for i in range(2)]
    started = time.monotonic()
    # The round's own two were started at once; their spares wait.
    assert all(taken) and made.counters["spawned"] == 2
    time.sleep(1.0)
    assert made.counters["spawned"] == 2 and made.idle_pids() == []
    deadline = started + 20
    while len(made.idle_pids()) < 2:
        assert time.monotonic() < deadline, made.counters
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.9
    for standby in taken:
        standby.close()


def test_spares_wait_while_the_instances_still_load_modules_under_the_preload_packages(pool, tmp_path):
    package = tmp_path / "twslow"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for i in range(4):
        (package / f"part{i}.py").write_text("")
    script = tmp_path / "job.py"
    # Starting: a module every 0.5 s for 2 s, then training.
    script.write_text("import importlib, time\nfor i in range(4):\n    importlib.import_module(f'twslow.part{i}')\n"
                      "    time.sleep(0.5)\ntime.sleep(3)\n")
    made = pool(("twslow",), spares_after_s=0.5, spares_after_learning_s=1.5)
    invocation, _ = python_invocation([sys.executable, str(script)])
    env = _env(tmp_path)
    standby = made.take("worker-0", invocation, env, str(tmp_path), MARK, "m")
    standby.hand_over(invocation, env, str(tmp_path))
    started = time.monotonic()
    deadline = started + 20
    while not made.idle_pids():
        assert time.monotonic() < deadline, made.counters
        time.sleep(0.05)
    # Not 0.5 s after the start: 1.5 s after the last of the four modules (about 1.5 s in).
    assert time.monotonic() - started >= 2.5, made.counters
    standby.popen.wait(30)


@pytest.fixture
def descriptors_past_select_limit():
    """Hold the low descriptor numbers, as a long-lived agent (or a whole test
    session) does, so the pool's pipes are numbered past select()'s 1024."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"the open-files limit is {soft}; this needs 1200")
    held = []
    while not held or held[-1] < 1100:
        held.append(os.open(os.devnull, os.O_RDONLY))
    yield
    for fd in held:
        os.close(fd)


def test_a_pool_in_a_process_with_more_than_1024_descriptors_still_serves_standbys(
        descriptors_past_select_limit, pool, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys; print('ran'); sys.exit(4)\n")
    made = pool()
    code, out, err = _run(made, [sys.executable, str(script)], _env(tmp_path), tmp_path)
    assert code == 4 and out == "ran\n", err
    assert not [line for line in made.said if "Error" in line], made.said
