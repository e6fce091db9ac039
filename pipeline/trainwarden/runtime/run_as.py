"""Instances run as another user than the supervisor (``--run-as USER``).

The supervisor (a node agent, ``trainwarden run``) holds the key that signs
commands. A process of the same user can read what the supervisor reads (the
key file) and, before the supervisor made itself undumpable, its memory and
environment (hardening.py). An instance started as another user, with that
user's group and no supplementary groups, can do neither: the safety of the
signing key depends on it (docs/OPERATIONS.md, "Jobs run as another user").

What an instance needs from its supervisor is made usable by that user here,
and nothing else: the SDK socket (its directory searchable and the socket
writable by the user's group; a request is still attributed by the calling
process, runtime/control.py), the SDK import directory (a link to this
package, readable), and the standby pool's directory where instances write
the modules they load. The supervisor never changes the owner of a path a
job names (its working or checkpoint directory): as root that would hand any
directory of the machine to the job. Those the job's user must be able to
use already; the instance creates its checkpoint directory itself.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import tempfile
from pathlib import Path
from typing import Mapping, Optional

_NUMERIC = re.compile(r"([0-9]{1,10})(?::([0-9]{1,10}))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
HINT = "give a user name (e.g. nobody) or UID[:GID] (e.g. 65534:65534)"


@dataclasses.dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    name: str = ""  # from the password database, "" for a uid it does not know
    home: str = ""

    def describe(self) -> str:
        who = f"{self.name} (uid {self.uid}" if self.name else f"uid {self.uid} ("
        return f"{who}{', ' if self.name else ''}gid {self.gid})"

    def popen_options(self) -> dict:
        """subprocess.Popen's: the user, its group, and no supplementary groups (not the supervisor's)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def environment(self, env: Mapping[str, str], supervisor: Mapping[str, str]) -> dict:
        """``env`` with the user's HOME, USER and LOGNAME where it holds the
        supervisor's own (inherited), not where the job set them itself."""
        own = dict(env)
        for variable, value in (("HOME", self.home), ("USER", self.name), ("LOGNAME", self.name)):
            if value and own.get(variable) == supervisor.get(variable):
                own[variable] = value
        return own

    def share_socket(self, socket_path: Path) -> None:
        """The SDK socket: its directory searchable and the socket writable
        by the user's group, nothing more (not listable, no one else's)."""
        directory = socket_path.parent
        os.chown(directory, -1, self.gid)
        os.chmod(directory, 0o710)
        os.chown(socket_path, -1, self.gid)
        os.chmod(socket_path, 0o660)

    def give(self, directory: Path) -> None:
        """A directory the supervisor made for the instances to write (never one a job names)."""
        os.chown(directory, self.uid, self.gid)


def parse_run_as(text: str) -> RunAs:
    """A user name, or UID[:GID] (GID: the user's own group, else the uid).
    Raises ValueError saying what is wrong."""
    text = text.strip()
    numeric = _NUMERIC.fullmatch(text)
    if numeric:
        uid = int(numeric.group(1))
        try:
            entry: Optional[pwd.struct_passwd] = pwd.getpwuid(uid)
        except KeyError:
            entry = None
        gid = int(numeric.group(2)) if numeric.group(2) else (entry.pw_gid if entry else uid)
    elif _NAME.fullmatch(text):
        try:
            entry = pwd.getpwnam(text)
        except KeyError:
            raise ValueError(f"there is no user named {text!r} on this machine") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    else:
        raise ValueError(f"{text[:40]!r} is neither a user name nor UID[:GID]")
    if uid > 0xFFFFFFFE or gid > 0xFFFFFFFE:
        raise ValueError(f"{text} is beyond the largest uid or gid")
    return RunAs(uid, gid, entry.pw_name if entry else "", entry.pw_dir if entry else "")


class RunAsError(ValueError):
    """--run-as names no usable user; ``hint`` says what to give."""

    def __init__(self, message: str, hint: str = HINT):
        super().__init__(message)
        self.hint = hint


def resolve(text: str) -> RunAs:
    """--run-as's user, checked against this process: raises RunAsError."""
    try:
        run_as = parse_run_as(text)
    except ValueError as exc:
        raise RunAsError(f"--run-as: {exc}") from None
    hint = "run the supervisor as root and give --run-as a user of the jobs' own, e.g. nobody"
    if run_as.uid == 0:
        raise RunAsError("--run-as root would give the jobs the supervisor's own power", hint)
    if run_as.uid == os.geteuid():
        raise RunAsError(f"--run-as {run_as.describe()} is the supervisor's own user, who can read its key", hint)
    if run_as.gid == os.getegid():
        raise RunAsError(f"--run-as {run_as.describe()} has the supervisor's own group, which may read its key",
                         "give the jobs' user a group of its own (UID:GID)")
    if os.geteuid() != 0:
        raise RunAsError("--run-as needs the supervisor to run as root, to start processes as another user", hint)
    return run_as


def sdk_home() -> Path:
    """A directory for the SDK import link that any user can search: the
    supervisor's own directories (its log directory, under a home of mode
    0700) may not be."""
    return Path(tempfile.mkdtemp(prefix="trainwarden-sdk-"))


def share_sdk_path(sdk_path: str) -> None:
    """The SDK import directory (runtime/environment.py: a link to this
    package, nothing else) readable by any user, its parent searchable."""
    path = Path(sdk_path)
    os.chmod(path.parent, 0o711)
    os.chmod(path, 0o755)
