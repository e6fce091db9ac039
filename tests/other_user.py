"""Jobs run as another user (``--run-as``, runtime/run_as.py) in tests: the
user (uid 65534, nobody on most systems), a Python that user can execute
with this checkout and its dependencies importable, and the skip reasons
where that cannot be (not root; no such Python)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

OTHER_UID = 65534
OTHER_GID = 65534


# Run as the other user with a pid: what of that process it may read (the
# environment, the memory, the descriptors). Opening /proc/PID/mem is what
# ptrace's rules allow or not (offset 0 is not mapped: no read).
DUMPABLE_PROBE = """
import os, sys
pid = sys.argv[1]
for name in ("environ", "mem", "fd"):
    path = f"/proc/{pid}/{name}"
    try:
        if name == "fd":
            os.listdir(path)
        elif name == "mem":
            open(path, "rb").close()
        else:
            with open(path, "rb") as f:
                f.read(1)
        print(name, "read")
    except OSError as exc:
        print(name, "refused", exc.errno)
"""


def _as_other(argv: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          user=OTHER_UID, group=OTHER_GID, extra_groups=[])


def python_path() -> str:
    """This checkout's package and this interpreter's site-packages (a venv's
    own may lie under a directory only its owner can enter: the other
    user's Python reads them through PYTHONPATH)."""
    return os.pathsep.join([str(ROOT / "pipeline"), sysconfig.get_paths()["purelib"]])


@functools.lru_cache(maxsize=1)
def _other_python() -> tuple[str, str]:
    if os.geteuid() != 0:
        return "", "jobs run as another user only under a supervisor that runs as root"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, os.path.realpath(sys.executable), shutil.which(version) or "",
                  f"/usr/bin/{version}", f"/usr/local/bin/{version}"]
    env = {"PATH": os.defpath, "PYTHONPATH": python_path(), "HOME": "/"}
    for candidate in dict.fromkeys(c for c in candidates if c):
        try:
            probe = _as_other([candidate, "-c", "import trainwarden.sdk.job_monitor, kafka, msgspec"], env)
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate, ""
    return "", (f"no {version} that uid {OTHER_UID} can execute and that imports this checkout's dependencies "
                "(a venv's interpreter under /root is not)")


def other_python() -> str:
    """A Python that uid 65534 can run (this interpreter's version), or skip saying why."""
    found, why = _other_python()
    if not found:
        pytest.skip(why)
    return found


def other_writable() -> Path:
    """A new directory the other user may write (none may remove another's
    files from it), outside pytest's temporary tree, which only the tests'
    user can enter: that one stays closed to the jobs, as a supervisor's
    files are. The caller removes it."""
    path = Path(tempfile.mkdtemp(prefix="tw-other-user-"))
    os.chmod(path, 0o1777)
    return path
