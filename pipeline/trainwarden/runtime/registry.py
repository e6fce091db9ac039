"""The runtimes, in one explicit registry: where a job's instances can run,
what each can do, and which command takes it.

    local   processes on this machine            trainwarden run
    agents  Trainwarden's node agents over Kafka  trainwarden submit
    slurm   a Slurm cluster (agents on its nodes) trainwarden submit --runtime slurm
"""

from __future__ import annotations

import dataclasses

from trainwarden.runtime.base import Capability


@dataclasses.dataclass(frozen=True)
class RuntimeKind:
    name: str
    summary: str
    command: str  # the CLI that runs jobs on it
    capabilities: frozenset[Capability]


def _kinds() -> tuple[RuntimeKind, ...]:
    # The declarations live on the runtime classes; the registry only names them.
    from trainwarden.runtime.agents import AgentsRuntime
    from trainwarden.runtime.launcher import LocalJobRunner
    from trainwarden.runtime.slurm.runtime import SlurmRuntime

    return (
        RuntimeKind("local", "processes on this machine", "trainwarden run", LocalJobRunner.capabilities),
        RuntimeKind("agents", "Trainwarden's node agents, over Kafka", "trainwarden submit",
                    AgentsRuntime.capabilities),
        RuntimeKind("slurm", "a Slurm cluster: steps in an allocation, agents on its nodes",
                    "trainwarden submit --runtime slurm", SlurmRuntime.capabilities),
    )


NAMES = ("local", "agents", "slurm")


class UnknownRuntime(ValueError):
    pass


def runtimes() -> tuple[RuntimeKind, ...]:
    return _kinds()


def runtime_kind(name: str) -> RuntimeKind:
    for kind in _kinds():
        if kind.name == name:
            return kind
    raise UnknownRuntime(f"there is no runtime {name!r}; the runtimes are {', '.join(NAMES)}")
