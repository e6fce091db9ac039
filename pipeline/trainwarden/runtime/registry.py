"""The runtimes, in one registry: where a job's instances can run, what each
can do, its options and how it is built. ``trainwarden runtimes``, ``submit
--runtime``, the actuator and agent commands' options, the actuator service
(which builds each job's runtime through its kind's site) and the scenario
tests all read it; a runtime's name is spelled in its entry alone.

A new runtime is one package (its ``JobRuntime``, its ``RuntimeSite``) and
one ``RuntimeKind`` entry, listed in ``_entries`` (docs/DESIGN.md shows the
shape); a test or a plugin may ``register`` one more.
"""

from __future__ import annotations

from typing import Any, Mapping

from trainwarden.runtime.base import RuntimeSite
from trainwarden.runtime.kind import ACTUATOR, AGENT, RuntimeKind, RuntimeOption  # noqa: F401 - the entry's shape


def _agents_site(options: Mapping[str, Any], run_as: Any) -> RuntimeSite:
    from trainwarden.runtime.agents import AgentsSite

    return AgentsSite()


LOCAL = RuntimeKind("local", "processes on this machine", "trainwarden run",
                    "trainwarden.runtime.launcher:LocalJobRunner", submitted=False)
AGENTS = RuntimeKind("agents", "Trainwarden's node agents, over Kafka", "trainwarden submit",
                     "trainwarden.runtime.agents:AgentsRuntime", site=_agents_site)
# Where a cluster job goes that names a kind this actuator does not reach; and submit's default.
FALLBACK = AGENTS


def _entries() -> tuple[RuntimeKind, ...]:
    # Imported when asked: the CLI builds its parser from the entries, not from every engine's client.
    from trainwarden.runtime.slurm.kind import KIND as SCHEDULER  # the registry's entry: runtime/slurm/
    from trainwarden.runtime.kubernetes.kind import KIND as PODS  # the registry's entry: runtime/kubernetes/

    return (LOCAL, AGENTS, SCHEDULER, PODS)


_REGISTERED: list[RuntimeKind] = []


class UnknownRuntime(ValueError):
    pass


def register(kind: RuntimeKind) -> RuntimeKind:
    """One more kind (a test's, a plugin's), after the built-in ones."""
    if kind.name in names():
        raise ValueError(f"a runtime named {kind.name!r} is registered already")
    _REGISTERED.append(kind)
    return kind


def unregister(name: str) -> None:
    _REGISTERED[:] = [kind for kind in _REGISTERED if kind.name != name]


def runtimes() -> tuple[RuntimeKind, ...]:
    return (*_entries(), *_REGISTERED)


def names() -> tuple[str, ...]:
    return tuple(kind.name for kind in runtimes())


def submitted() -> tuple[RuntimeKind, ...]:
    """The kinds ``trainwarden submit --runtime`` offers."""
    return tuple(kind for kind in runtimes() if kind.submitted)


def runtime_kind(name: str) -> RuntimeKind:
    for kind in runtimes():
        if kind.name == name:
            return kind
    raise UnknownRuntime(f"there is no runtime {name!r}; the runtimes are {', '.join(names())} "
                         f"(trainwarden runtimes lists them)")


def sites(options: Mapping[str, Any], run_as: Any = None) -> dict[str, RuntimeSite]:
    """The sites an actuator reaches, by kind, from its options."""
    found = {}
    for kind in submitted():
        site = kind.site(options, run_as) if kind.site is not None else None
        if site is not None:
            found[kind.name] = site
    return found


def examples(command: str) -> list[str]:
    """The example lines the kinds add to a command's help."""
    return [line for kind in runtimes() for where, line in kind.examples if where == command]


def run_as_flags() -> list[str]:
    """The actuator options that configure a kind whose site submits as --run-as's user."""
    return [flag for kind in submitted() if kind.runs_as for flag in kind.flags(ACTUATOR)[:1]]


def agent_setup(options: Mapping[str, Any]) -> dict:
    """The node agent's keyword arguments the kinds ask for, from its options:
    every kind's adopters together (one agent adopts for every engine on its node)."""
    setup: dict = {"adopters": []}
    for kind in runtimes():
        if kind.agent_setup is not None:
            for key, value in kind.agent_setup(options).items():
                if key == "adopters":
                    setup["adopters"].extend(value)
                else:
                    setup[key] = value
    return setup
