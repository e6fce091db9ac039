"""The spot scenario's Kubernetes side: one node of the local cluster made
the market pool's (its label and taint, as a cloud's spot node pool has
them, removed after), and every state of the job's pods seen meanwhile (a
list every 0.2 s: a released pod shows as terminating with its
DisruptionTarget condition for its deletion's grace)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator

from tests.scenarios.runtimes import KUBE_NODES, _kube_namespace
from trainwarden.runtime.kubernetes.section import POOL_KEY

POOL_NODE = KUBE_NODES[1]


class PodsSeen:
    """The newest state of each pod of the job, by name, as listed."""

    def __init__(self, api, namespace: str, job_id: str):
        self.api, self.namespace, self.job_id = api, namespace, job_id
        self.pods: dict[str, dict] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from trainwarden.runtime.kubernetes.api import KubeError
        from trainwarden.runtime.kubernetes.manifests import job_selector

        while not self._done.wait(0.2):
            try:
                for pod in self.api.pods(self.namespace, job_selector(self.job_id)):
                    self.pods[pod["metadata"]["name"]] = pod
            except KubeError:
                continue  # the next list

    def disruption(self, name: str) -> str:
        """The reason of the pod's DisruptionTarget condition as last seen, "" for none."""
        conditions = (self.pods[name].get("status") or {}).get("conditions") or ()
        return next((c.get("reason", "") for c in conditions if c.get("type") == "DisruptionTarget"), "")


@contextlib.contextmanager
def pool_node(pool: str, job_id: str) -> Iterator[PodsSeen]:
    """POOL_NODE labelled and tainted (NoSchedule) ``trainwarden.io/pool=<pool>``
    while the job runs; its pods, as seen. Both undone at the end."""
    from trainwarden.runtime.kubernetes.api import KubeApi

    api = KubeApi.connect(os.environ["KUBECONFIG"])
    taint = {"key": POOL_KEY, "value": pool, "effect": "NoSchedule"}

    def others(node: dict) -> list:
        return [t for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != POOL_KEY]

    node = api.node(POOL_NODE)
    api.patch_node(POOL_NODE, {"metadata": {"labels": {POOL_KEY: pool}}, "spec": {"taints": others(node) + [taint]}})
    seen = PodsSeen(api, _kube_namespace(api), job_id)
    seen._thread.start()
    try:
        yield seen
    finally:
        seen._done.set()
        seen._thread.join(5)
        node = api.node(POOL_NODE)
        api.patch_node(POOL_NODE, {"metadata": {"labels": {POOL_KEY: None}}, "spec": {"taints": others(node)}})


def check_pods(seen: PodsSeen, outcome) -> None:
    """Every pod of the job ran on the pool's node (its label selected, its
    taint tolerated), one per instance for each round the market let it run
    (none while it was queued); the pods of a round the market took back
    were marked DisruptionTarget (TerminationByTrainwarden) before they went."""
    from trainwarden.runtime.kubernetes.manifests import INSTANCE_ANNOTATION, RELEASE_REASON, ROUND_LABEL

    pods = seen.pods
    assert pods, "no pod of the job was seen"
    for name, pod in pods.items():
        spec = pod["spec"]
        assert spec.get("nodeName") == POOL_NODE, (name, spec.get("nodeName"))
        assert spec["nodeSelector"][POOL_KEY] == "general", spec["nodeSelector"]
        assert {"key": POOL_KEY, "operator": "Equal", "value": "general"} in [
            {k: t.get(k) for k in ("key", "operator", "value")} for t in spec["tolerations"]], spec["tolerations"]
    running = [r["round"] for r in outcome.spot if r["state"] == "running"]
    rounds = sorted(int(p["metadata"]["labels"][ROUND_LABEL]) for p in pods.values())
    assert rounds == sorted(running * 2), (rounds, running)  # two workers a running period; no pod while queued
    released = {int(p["metadata"]["labels"][ROUND_LABEL]) for name, p in pods.items()
                if seen.disruption(name) == RELEASE_REASON}
    assert released == set(running[:-1]), (released, running, {n: seen.disruption(n) for n in pods})
    for name, pod in pods.items():
        if int(pod["metadata"]["labels"][ROUND_LABEL]) in released:
            assert pod["metadata"]["annotations"][INSTANCE_ANNOTATION] in ("worker-0", "worker-1")
            assert seen.disruption(name) == RELEASE_REASON, name


def check_none_left(seen: PodsSeen) -> None:
    """The job ended: within 20 s no pod of it is left (each was seen on the pool's node)."""
    assert seen.pods and all(p["spec"].get("nodeName") == POOL_NODE for p in seen.pods.values()), seen.pods.keys()
    from trainwarden.runtime.kubernetes.manifests import job_selector

    deadline = time.monotonic() + 20
    while (left := seen.api.pods(seen.namespace, job_selector(seen.job_id))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [p["metadata"]["name"] for p in left]
