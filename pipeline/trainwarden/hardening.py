"""A long-lived process's protection from the jobs beside it: the services
(agent, processor, actuator, notifier) and ``trainwarden run`` hold the key
that signs commands, and a job must not be able to take it from them.

``protect()`` (called once where such a process starts, cli/main.py):

- makes the process not dumpable (``PR_SET_DUMPABLE`` 0): its /proc files
  (environ, mem, fd) belong to root and no process of the same user can
  ptrace it, read its memory or open its descriptors;
- keeps the secrets given in the environment ($TRAINWARDEN_SIGNING_KEY,
  $TRAINWARDEN_KAFKA_SASL_PASSWORD) out of it. Removing a variable from
  ``os.environ`` is not enough: /proc/PID/environ shows the environment
  block the process was started with, whatever it changed since. So the
  process starts itself again (``execve``, same pid, same descriptors)
  without them, handing them over in an anonymous memory file it inherits
  (``memfd_create``), read and closed at once. From then on the secrets live
  in this module only (``secrets()``), where the bus reads them, and no
  child inherits them.

None of this stops a process that runs as root, or as the services' user
before ``protect()`` has run: the jobs must run as another user
(``--run-as``, runtime/run_as.py; docs/OPERATIONS.md, "Jobs run as another
user").
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Optional

from trainwarden.yamlsrc import ConfigError

# The variables whose values are secrets (the key file and password file
# variables name files, which are kept).
SECRET_VARIABLES = ("TRAINWARDEN_SIGNING_KEY", "TRAINWARDEN_KAFKA_SASL_PASSWORD")
# The descriptor of the memory file that carries them across the execve.
HANDED_OVER = "TRAINWARDEN_HANDED_SECRETS_FD"
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
_MAX_HANDED_BYTES = 1 << 20

_secrets: dict[str, str] = {}


def secrets() -> dict[str, str]:
    """The secret variables this process was given, once ``protect()`` took
    them out of its environment; to be laid over ``os.environ`` by whoever
    reads those variables (bus/__init__.py, bus/kafka_security.py)."""
    return dict(_secrets)


def make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0 for this process; False where the system has no prctl."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def dumpable() -> Optional[bool]:
    """Whether this process is dumpable now (None where prctl is missing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 1
    except (OSError, AttributeError):
        return None


def protect(restart: bool = True) -> None:
    """Not dumpable, and the secret variables out of the environment.

    ``restart``: the process may execve itself again with ``sys.orig_argv``
    (the caller knows it was started from the command line it is running,
    not called inside another program, such as a test runner). Without it,
    or if the execve fails, the variables are only removed from
    ``os.environ``: no child inherits them, but /proc/PID/environ (root and
    this user's readers only, the process being not dumpable) still shows
    them."""
    make_undumpable()
    if HANDED_OVER in os.environ:
        _receive(os.environ.pop(HANDED_OVER))
        return
    given = {name: os.environ[name] for name in SECRET_VARIABLES if name in os.environ}
    if not given:
        return
    if restart:
        _restart_without(given)  # returns only if the execve failed
    for name in given:
        os.environ.pop(name, None)
    _secrets.update(given)


def _restart_without(given: dict[str, str]) -> None:
    try:
        fd = os.memfd_create("trainwarden-secrets", 0)  # no MFD_CLOEXEC: the new program inherits it
    except (OSError, AttributeError):
        return
    try:
        data = json.dumps(given).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        env = {name: value for name, value in os.environ.items() if name not in SECRET_VARIABLES}
        env[HANDED_OVER] = str(fd)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.set_inheritable(fd, True)
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError as exc:
        print(f"trainwarden: could not restart without the secret variables ({exc.strerror or exc}); they are "
              "removed from the environment, but /proc of this process still shows them to root", file=sys.stderr)
    os.close(fd)


def _receive(text: str) -> None:
    """The secrets the previous program of this process handed over."""
    problem = "it is not a descriptor number"
    handed: object = None
    if text.isdigit():
        fd = int(text)
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            raw = os.read(fd, _MAX_HANDED_BYTES + 1)
            os.close(fd)
            handed = json.loads(raw) if len(raw) <= _MAX_HANDED_BYTES else None
            problem = "what it holds is not the secrets trainwarden hands over"
        except (OSError, ValueError) as exc:
            problem = f"it cannot be read ({getattr(exc, 'strerror', None) or exc.__class__.__name__})"
    if not (isinstance(handed, dict) and handed and all(
            name in SECRET_VARIABLES and isinstance(value, str) for name, value in handed.items())):
        raise ConfigError(f"${HANDED_OVER} is set to {text[:20]!r}, but {problem}.",
                          hint="unset it: trainwarden sets it only for itself, across its own restart")
    _secrets.update(handed)
