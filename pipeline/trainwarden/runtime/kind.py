"""What a runtime kind is: the shape of one entry of the registry
(runtime/registry.py): its name, what it runs on, its ``JobRuntime`` class,
the options it adds to the actuator's and the agent's commands, and how an
actuator reaches it (its ``RuntimeSite``)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, Optional

from trainwarden.runtime.base import Capability, RuntimeSite

# Whose option a runtime's option is.
ACTUATOR = "actuator"
AGENT = "agent"


@dataclasses.dataclass(frozen=True)
class RuntimeOption:
    """A command-line option a runtime adds to ``trainwarden actuator`` or
    ``trainwarden agent`` (its environment variable: TRAINWARDEN_<FLAG>
    unless ``env`` names another)."""

    command: str  # ACTUATOR or AGENT
    flag: str  # e.g. "--cache-dir"; its value reaches ``site``/``agent_setup`` as options["cache_dir"]
    help: str
    env: str = ""
    metavar: str = ""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclasses.dataclass(frozen=True)
class RuntimeKind:
    """One kind of runtime. ``runtime`` is its ``JobRuntime`` class as
    "module:Class", imported only when its capabilities are asked (the CLI
    builds its options without importing every engine's client)."""

    name: str
    summary: str
    command: str  # the CLI that runs jobs on it
    runtime: str
    # Built by the actuator for ``trainwarden submit --runtime NAME``; False: ``trainwarden run`` builds it.
    submitted: bool = True
    options: tuple[RuntimeOption, ...] = ()
    examples: tuple[tuple[str, str], ...] = ()  # (command, example line) added to that command's help
    # The actuator's site from its options (option dest -> value) and its --run-as
    # user; None while not configured (its jobs then run on the fallback kind).
    site: Optional[Callable[[Mapping[str, Any], Any], Optional[RuntimeSite]]] = None
    # True when ``site`` submits as --run-as's user: the actuator's --run-as is for such a kind.
    runs_as: bool = False
    # The node agent's keyword arguments from its options, on this kind's nodes.
    agent_setup: Optional[Callable[[Mapping[str, Any]], dict]] = None
    # Before ``submit`` sends a job of this kind: its job file (None for a command after --)
    # -> "" when its engine can run it, else the one sentence (and hint) why not; submit exits 2.
    pre_submit: Optional[Callable[[Optional[str]], str]] = None

    @property
    def capabilities(self) -> frozenset[Capability]:
        module, _, cls = self.runtime.partition(":")
        return getattr(importlib.import_module(module), cls).capabilities

    def flags(self, command: str) -> list[str]:
        return [option.flag for option in self.options if option.command == command]
