"""The ``kubernetes`` runtime's entry in the registry (runtime/registry.py):
its name, options, examples, the check ``submit`` runs and how an actuator
reaches it. Light on purpose: the CLI reads it to build its options; the
Kubernetes client is imported only when an actuator is configured for it
or a job is submitted to it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from trainwarden.runtime.kind import ACTUATOR, AGENT, RuntimeKind, RuntimeOption


def _site(options: Mapping[str, Any], run_as: Any) -> Optional[Any]:
    if not options.get("k8s_state_dir"):
        return None
    from trainwarden.runtime.kubernetes.api import KubeApi
    from trainwarden.runtime.kubernetes.drivers import AgentPodDriver
    from trainwarden.runtime.kubernetes.runtime import KubeSite

    return KubeSite(api=KubeApi.connect(options.get("kubeconfig")), driver=AgentPodDriver(),
                    python=options.get("k8s_python") or sys.executable, state_dir=options["k8s_state_dir"],
                    agent_dir=options.get("k8s_agent_dir") or "")


def _agent(options: Mapping[str, Any]) -> dict:
    state_dir = options.get("k8s_state_dir")
    if not state_dir:
        return {}
    from trainwarden.runtime.kubernetes.adopt import adopter

    setup: dict = {"adopters": [adopter(Path(state_dir), options["node"])]}
    if options.get("k8s_agent_dir"):
        # The pods mount this directory (the actuator's --k8s-agent-dir): the jobs' SDK calls reach this agent.
        setup["control_path"] = Path(options["k8s_agent_dir"]) / options["node"] / "control.sock"
    return setup


def _pre_submit(job_file: Optional[str]) -> str:
    from trainwarden.runtime.kubernetes.check import check, no_job_file

    return check(job_file) if job_file else no_job_file()


KIND = RuntimeKind(
    "kubernetes", "a Kubernetes cluster: one pod per instance, restarted in place",
    "trainwarden submit --runtime kubernetes", "trainwarden.runtime.kubernetes.runtime:KubernetesRuntime",
    options=(
        RuntimeOption(AGENT, "--k8s-state-dir", "on a Kubernetes node: the nodes' pod host directory (the "
                                                "actuator's --k8s-state-dir); the agent runs and follows the "
                                                "incarnations of the pods on its node (--node must be the "
                                                "Kubernetes node name; the host's PID namespace)"),
        RuntimeOption(AGENT, "--k8s-agent-dir", "with --k8s-state-dir: where this agent's SDK endpoint listens "
                                                "(in NODE/control.sock), a directory every pod mounts (the "
                                                "actuator's --k8s-agent-dir)"),
        RuntimeOption(ACTUATOR, "--k8s-state-dir", "run jobs submitted with --runtime kubernetes as pods; the "
                                                   "nodes' directory the pod hosts and agents share (a hostPath)"),
        RuntimeOption(ACTUATOR, "--kubeconfig", "the kubeconfig to reach the apiserver with (as for kubectl)",
                      env="KUBECONFIG"),
        RuntimeOption(ACTUATOR, "--k8s-python", "the interpreter that runs the pod host in the job's image "
                                                "(default: this one's path)"),
        RuntimeOption(ACTUATOR, "--k8s-agent-dir", "the node agents' SDK endpoint directory, mounted read-only in "
                                                   "every pod at the same path"),
    ),
    examples=(
        (AGENT, "trainwarden agent --node gpu-node-7 --k8s-state-dir /var/lib/trainwarden/pods "
                "--k8s-agent-dir /run/trainwarden/agents"),
        (ACTUATOR, "trainwarden actuator --k8s-state-dir /var/lib/trainwarden/pods --kubeconfig ~/.kube/config"),
        ("submit", "trainwarden submit job.yaml --runtime kubernetes --follow   # job.yaml has a kubernetes: section"),
    ),
    site=_site, agent_setup=_agent, pre_submit=_pre_submit)
