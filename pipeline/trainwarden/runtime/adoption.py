"""Adopting a process another engine started: the node host's plug-in point.

Some engines start the instances themselves (a batch scheduler's task
launcher, a Kubernetes pod); the node host then follows them like its own,
but only once their incarnation is proven: the actuator announces the
incarnations it issued tokens for (``expect``), and the engine's own package
(``runtime/<engine>/``) checks that a process on this node really is one of
them. Other engines start a process only when asked, in a place of their
own (a pod's host): the node host hands such a start to the adopter that
claims it (``launch``) and adopts what it started. The node host knows no
engine: it takes a list of adopters.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Callable, Hashable, Mapping, Optional, Protocol, Sequence

from trainwarden.runtime.control import Incarnation


@dataclasses.dataclass(frozen=True)
class Adopted:
    """A process proven to be this incarnation: the node host's from now on."""

    incarnation: Incarnation
    token: str  # the token the actuator issued for it (the SDK endpoint accepts it)
    pid: int  # its own process; 0 when it was gone before it could be adopted
    key: Hashable  # the adopter's own name for it


@dataclasses.dataclass(frozen=True)
class Launch:
    """A start the node host hands to the engine that runs it (``Adopter.launch``)."""

    incarnation: Incarnation
    token: str  # issued by the node's SDK endpoint; its process proves itself with it
    command: tuple[str, ...]
    env: Mapping[str, str]  # the whole incarnation environment (nodehost.incarnation_env)
    workdir: str


@dataclasses.dataclass(frozen=True)
class Stopped:
    """An adopted incarnation to stop, and its process (0: not proven yet)."""

    incarnation: Incarnation
    pid: int


class Adopter(Protocol):
    """One engine's way of finding, proving and stopping the processes it
    started on this node."""

    def expect(self, job_id: str, incarnations: Sequence[tuple[str, int, int, str]]) -> None:
        """The actuator announced these incarnations: (instance, round, start, token digest)."""

    def claims(self, asked: Mapping[str, str]) -> bool:
        """A start whose job variables (``asked``) say it runs in a place of
        this engine's (a pod's uid): the node host hands it to ``launch``
        instead of starting a process itself."""

    def launch(self, launch: Launch) -> None:
        """Start a claimed incarnation where it belongs (at once, or once its
        place can take it); its ``Adopted`` and events come from ``poll``."""

    def poll(self) -> list:
        """What happened since: an ``Adopted`` first for each newly proven
        process, then InstanceStarted, LogLine and InstanceExited events of
        adopted incarnations, as the node host's own processes give them."""

    def stop(self, stopped: Sequence[Stopped], grace_s: float) -> None:
        """SIGTERM these adopted incarnations' trees, SIGKILL what is left
        after the grace period; returns once done. One launched but not
        started yet never starts."""


# Built once the node's SDK endpoint listens: told its address (the
# engine's processes find it there).
AdopterFactory = Callable[[str], Adopter]


def token_digest(token: str) -> str:
    """How the actuator announces a token: never the token itself on the bus."""
    return hashlib.sha256(token.encode()).hexdigest()


class Announcements:
    """The incarnations the actuator announced for this node's adopters:
    a token proves a process only when it hashes to one of these."""

    def __init__(self):
        self._by_digest: dict[str, Incarnation] = {}

    def expect(self, job_id: str, incarnations: Sequence[tuple[str, int, int, str]]) -> None:
        for instance, round_, start, digest in incarnations:
            self._by_digest[digest] = Incarnation(job_id, instance, round_, start)

    def incarnation(self, token: Optional[str]) -> Optional[Incarnation]:
        return self._by_digest.get(token_digest(token)) if token else None


def executed_token(pid: int) -> Optional[str]:
    """The incarnation token the process was executed with (its
    ``/proc/PID/environ``, which only its exec set)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"TRAINWARDEN_TOKEN="):
            return item.split(b"=", 1)[1].decode("utf-8", errors="replace")
    return None
