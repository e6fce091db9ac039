"""Pre-warmed interpreters: a standby Python process that has already
imported a job's heavy modules (``preload``) and becomes an instance when a
round starts, so that a restart does not pay for ``import torch`` again.

A standby is started with the job's environment, imports the modules and
does nothing else (no process group, no CUDA work, no user code). Then it
waits on a pipe for its instance: the instance's own environment, its
working directory and the user's command line, which it runs as ``python``
would (a script, ``-m module`` or ``-c code``, ``sys.argv``, ``__main__``).
At the end it waits for non-daemon threads and runs ``atexit`` handlers as
the interpreter does, then leaves with ``os._exit``: the teardown of
thousands of modules (0.6-0.8 s with torch) is skipped, so a crash is
reported as soon as the process is gone.

The control channel carries newline-ended JSON messages: ``{"import":
[names]}`` makes a waiting standby import more modules (what the job's
instances imported lazily under the preload packages, ``learned``), and
``{"become": {...}}`` hands it its instance. On a Unix socket the ``become``
message may carry three descriptors (``SCM_RIGHTS``): the instance's stdin,
stdout and stderr, for a standby that was started before its output had a
place (a batch scheduler's per-task files).

A standby-started instance appends the name of every module it loads under
the preload packages to a file the pool names (``learn``): ``import torch``
leaves ``torch._dynamo`` for the first optimizer to import (1.5 s), and
the next standbys import it before they are needed.

``python_invocation`` decides whether a command can run in a standby; a
command it refuses starts as an ordinary process. What a preloaded module
may not do at import time: read a variable of one instance (rank, world
size, master address and port, round, SDK socket), since it is imported
before any instance exists; start threads or processes; touch a GPU.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import runpy
import signal
import socket
import stat
import sys
import threading
import traceback
import types
from typing import Optional, Sequence

# Interpreter options that a running interpreter can honour; any other one
# (-O, -I, -E, -X, -W, ...) changes how the interpreter starts, so such a
# command starts as an ordinary process.
_FLAGS = {"-u": "unbuffered", "-B": "no_bytecode"}


@dataclasses.dataclass(frozen=True)
class Invocation:
    """What ``python ARGS`` would run: exactly one of script, module, code."""

    interpreter: str
    argv: tuple[str, ...]  # sys.argv as python would set it
    script: str = ""
    module: str = ""
    code: Optional[str] = None
    unbuffered: bool = False
    no_bytecode: bool = False


def is_python(program: str) -> bool:
    name = os.path.basename(program)
    return name == "python" or (name.startswith("python") and all(c.isdigit() or c == "." for c in name[6:]))


def python_invocation(command: Sequence[str]) -> tuple[Optional[Invocation], str]:
    """(the invocation, "") when a standby can run ``command``, else
    (None, why not)."""
    if not command or not is_python(command[0]):
        return None, f"{command[0] if command else 'the command'} is not a Python interpreter"
    flags = {"unbuffered": False, "no_bytecode": False}
    args = list(command[1:])
    while args and args[0].startswith("-") and args[0] not in ("-", "-m", "-c"):
        option = args.pop(0)
        if option == "--":
            break
        letters = option[1:]
        if not letters or any(f"-{letter}" not in _FLAGS for letter in letters):
            return None, f"the interpreter option {option} needs a fresh interpreter"
        for letter in letters:
            flags[_FLAGS[f"-{letter}"]] = True
    if not args:
        return None, "an interactive interpreter needs a fresh process"
    if args[0] == "-m":
        if len(args) < 2:
            return None, "-m without a module"
        return Invocation(command[0], (args[1], *args[2:]), module=args[1], **flags), ""
    if args[0] == "-c":
        if len(args) < 2:
            return None, "-c without code"
        return Invocation(command[0], ("-c", *args[2:]), code=args[1], **flags), ""
    if args[0] == "-":
        return None, "a script read from standard input needs a fresh process"
    return Invocation(command[0], tuple(args), script=args[0], **flags), ""


# ------------------------------------------------------------ the standby side

def _exit_code(value) -> int:
    """As the interpreter maps SystemExit's argument."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _user_traceback(exc: BaseException) -> None:
    """The traceback a fresh interpreter would print: without this module's
    and runpy's frames above the user's code."""
    tb = exc.__traceback__
    own = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}

    def ours(filename: str) -> bool:
        return filename == "<frozen runpy>" or os.path.abspath(filename) in own

    while tb is not None and ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _finish(code: int) -> None:
    # What Py_FinalizeEx does first (non-daemon threads, then atexit), then
    # leave without tearing the modules down.
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a thread that fails to join must not change the exit code
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken pipe: nothing more to say
            pass
    os._exit(code)


MODULE_NAME_MAX = 200


def is_module_name(name: str) -> bool:
    return 0 < len(name) <= MODULE_NAME_MAX and all(part.isidentifier() for part in name.split("."))


class _ImportRecorder:
    """First on ``sys.meta_path``: told of every module about to be loaded,
    by an import statement or ``importlib.import_module`` alike; it finds
    nothing itself, so the import goes on as without it."""

    def __init__(self, fd: int, roots: frozenset):
        self.fd = fd
        self.roots = roots
        self.seen = set(sys.modules)

    def find_spec(self, name, path=None, target=None):
        if name not in self.seen and name.partition(".")[0] in self.roots:
            self.seen.add(name)
            try:
                os.write(self.fd, (name + "\n").encode("utf-8", "replace"))
            except OSError:
                pass
        return None

    def invalidate_caches(self) -> None:
        pass


def learn_imports(path: str, roots: Sequence[str]) -> None:
    """Append each module this process loads from now on under ``roots``
    to ``path``: one small append per module, no thread (a later ``fork``
    is as safe as without it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    sys.meta_path.insert(0, _ImportRecorder(fd, frozenset(roots)))


def _take_streams(fds: Sequence[int]) -> None:
    """The instance's stdin, stdout and stderr, received with its description."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)


def become(message: dict, fds: Sequence[int] = ()) -> None:
    """Run the instance described by ``message`` in this interpreter; never returns."""
    invocation = Invocation(**{**message["invocation"], "argv": tuple(message["invocation"]["argv"])})
    env = message["env"]
    if fds:
        _take_streams(fds)
    if message.get("learn") and message.get("roots"):
        learn_imports(str(message["learn"]), [str(root) for root in message["roots"]])
    if message.get("cwd"):
        os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    if invocation.unbuffered or env.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    sys.dont_write_bytecode = invocation.no_bytecode or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = list(invocation.argv)
    code = 0
    try:
        if invocation.module:
            sys.path[0] = os.getcwd()
            runpy.run_module(invocation.module, run_name="__main__", alter_sys=True)
        elif invocation.code is not None:
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(invocation.code, "<string>", "exec"), main.__dict__)  # noqa: S102 - the user's own -c
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(invocation.script))
            runpy.run_path(invocation.script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt as exc:
        _user_traceback(exc)
        _finish_by_signal(signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001 - reported as the interpreter reports it
        _user_traceback(exc)
        code = 1
    _finish(code)


def _finish_by_signal(signum: int) -> None:
    """A fresh interpreter interrupted by SIGINT dies of the signal: so does this one."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


class _Control:
    """The standby's end of its control channel: a pipe, or a Unix socket
    that can also pass descriptors."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd) if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
        self.fd = fd
        self.buffer = b""
        self.fds: list[int] = []

    def message(self) -> Optional[dict]:
        """The next message, or None at the end of the channel."""
        while b"\n" not in self.buffer:
            if self.sock is not None:
                chunk, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 3)
                self.fds.extend(fds)
            else:
                chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        else:
            os.close(self.fd)


def _import_quietly(names: Sequence[str]) -> None:
    """Learned modules: one that no longer imports is the instance's to find out."""
    for name in names:
        if isinstance(name, str) and is_module_name(name) and name not in sys.modules:
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - an optional module of a library, absent here
                pass


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python .../standby.py CONTROL_FD READY_FD [MODULE ...]``: run as a
    script, so that any Python of the job can be a standby."""
    args = list(sys.argv[1:] if argv is None else argv)
    control_fd, ready_fd, modules = int(args[0]), int(args[1]), args[2:]
    # Started as a script, sys.path[0] is this file's directory, whose module
    # names must not shadow the job's: the job's working directory instead.
    sys.path[0] = os.getcwd()
    status = b"R"
    for name in modules:
        try:
            __import__(name)
        except BaseException as exc:  # noqa: BLE001 - the instance imports what it needs itself, as fresh
            # Said to the pool, not on stderr: that is the instance's output.
            status = f"F preloading {name} failed: {type(exc).__name__}: {exc}"[:500].encode("utf-8", "replace")
            break
    try:
        os.write(ready_fd, status)
    except OSError:
        pass  # the pool no longer asks: it handed this standby its instance before the imports ended
    os.close(ready_fd)
    control = _Control(control_fd)
    while True:
        message = control.message()
        if message is None:  # the pool closed: nothing to become
            os._exit(0)
        if "import" in message:
            _import_quietly(message["import"])
            continue
        fds = control.fds
        control.close()
        become(message["become"], fds)


if __name__ == "__main__":
    main()
