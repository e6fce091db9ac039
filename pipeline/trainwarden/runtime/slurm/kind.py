"""The ``slurm`` runtime's entry in the registry (runtime/registry.py): its
name, options, examples and how an actuator reaches it. Light on purpose:
the CLI reads it to build its options; the Slurm client is imported only
when an actuator is configured for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from trainwarden.runtime.kind import ACTUATOR, AGENT, RuntimeKind, RuntimeOption


def _site(options: Mapping[str, Any], run_as: Any) -> Optional[Any]:
    if not options.get("slurm_dir"):
        return None
    from trainwarden.runtime.slurm.cli import SlurmCli
    from trainwarden.runtime.slurm.runtime import SlurmSite

    return SlurmSite(SlurmCli(options.get("slurm_conf"), run_as=run_as), Path(options["slurm_dir"]))


def _agent(options: Mapping[str, Any]) -> dict:
    directory = options.get("slurm_dir")
    if not directory:
        return {}
    from trainwarden.runtime.slurm.adopt import adopter

    return {"adopters": [adopter(Path(directory), options["node"])]}


KIND = RuntimeKind(
    "slurm", "a Slurm cluster: steps in an allocation, agents on its nodes", "trainwarden submit --runtime slurm",
    "trainwarden.runtime.slurm.runtime:SlurmRuntime",
    options=(
        RuntimeOption(AGENT, "--slurm-dir", "on a Slurm node: the directory shared with the actuator's --slurm-dir; "
                                            "the agent follows the Slurm tasks on its node (--node must be the Slurm "
                                            "node name)"),
        RuntimeOption(ACTUATOR, "--slurm-dir", "run jobs submitted with --runtime slurm through Slurm; plans, task "
                                               "manifests and output files go here (a directory every Slurm node "
                                               "sees)"),
        RuntimeOption(ACTUATOR, "--slurm-conf", "the slurm.conf to use (as for any Slurm client)", env="SLURM_CONF"),
    ),
    examples=(
        (AGENT, "trainwarden agent --node n1 --slurm-dir /shared/tw        # on a Slurm node"),
        (ACTUATOR, "trainwarden actuator --slurm-dir /shared/tw --node-timeout 30"),
        ("submit", "trainwarden submit job.yaml --runtime slurm --follow"),
    ),
    site=_site, runs_as=True, agent_setup=_agent)
