"""Back to training after a SIGKILL, on the real local Kubernetes cluster:
real torch DDP (gloo, CPU; tests/torch/programs/ddp_train.py), one rank per
pod, two pods, rank 1 SIGKILLing itself in round 0. Three ways to restart:

    in place            the next incarnation in the same pods (the kubernetes runtime)
    in place, preload   the same, from a warm standby in each pod that imported torch
    recreate            every pod deleted and created again (what JobSet and Kubeflow do)

For each, over ``--repeat`` runs (median): seconds from the fault (the
rank's own "injecting" line) to every new process started (as the pod
hosts report them) and to every rank's first training step of round 1.
The restart decision is taken here the moment the killed rank's exit
arrives (the engine's part is measured by bench/restart_preload.py). The
runtime is driven as the actuator drives it, its pod hosts from this
machine as the node's agent drives them.

    export KUBECONFIG=... ; .venv/bin/python bench/k8s_restart.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import torch_faults  # noqa: E402 - the job's line format and its parsing

from trainwarden.events import InstanceExited, InstanceSpec, InstanceStarted, JobSpec, LogLine, RoleSpec  # noqa: E402
from trainwarden.runtime.kubernetes.api import KubeApi  # noqa: E402
from trainwarden.runtime.kubernetes.node_side import PodHosts  # noqa: E402
from trainwarden.runtime.kubernetes.drivers import LocalPodDriver  # noqa: E402
from trainwarden.runtime.base import JobEvent, JobToRun  # noqa: E402
from trainwarden.runtime.kubernetes.runtime import KubeSite  # noqa: E402
from trainwarden.runtime.kubernetes.section import HostPath, KubernetesSection  # noqa: E402
from trainwarden.runtime.nodes import Cluster  # noqa: E402
from trainwarden.settings import JobSettings  # noqa: E402

IMAGE = "trainwarden.local/workload:1"
INSTANCES = (InstanceSpec("worker-0", "worker", 0, 0), InstanceSpec("worker-1", "worker", 1, 1))
# About 30 s of steady training before the fault: the pods' spares have imported torch by then.
STEPS = ("--steps", "560", "--fault-step", "500", "--step-s", "0.05")
MODES = ("in place", "in place, preload", "recreate")


def run_once(api: KubeApi, namespace: str, mode: str, cap_s: float = 240.0) -> dict:
    work = Path(tempfile.mkdtemp(prefix="twk-", dir="/tmp"))
    events: list = []
    started_at: dict[str, float] = {}  # each round-1 process's start, seen here (wall clock, as the job's lines)

    def hear(said) -> None:
        # What the runtime says: here only the engine's events (JobEvent) are kept; nothing is sent anywhere.
        for event in (e.event for e in said if isinstance(e, JobEvent)):
            if isinstance(event, InstanceStarted) and event.round == 1:
                started_at.setdefault(event.instance, time.time())
            events.append(event)

    (work / "ckpt").mkdir()
    try:
        section = KubernetesSection(image=IMAGE, namespace=namespace, image_pull_policy="Never", host_paths=tuple(
            [HostPath(p) for p in sorted({"/usr", sys.base_prefix, str(ROOT)})] + [HostPath(str(work), True)]))
        command = (sys.executable, "-u", str(torch_faults.PROGRAM), "--fault", "sigkill", "--fault-rank", "1", *STEPS,
                   "--checkpoint-dir", str(work / "ckpt"), "--result", str(work / "result.json"))
        spec = JobSpec(roles=(RoleSpec("worker", 2, command),), runtime="kubernetes", stop_grace_s=3.0,
                       preload=("torch",) if "preload" in mode else (),
                       runtime_options=json.dumps({"kubernetes": section.to_wire()}))
        site = KubeSite(api=api, driver=LocalPodDriver(PodHosts(work / "pods", "", time.monotonic)),
                        python=sys.executable, state_dir=str(work / "pods"), rendezvous_by_name=True)
        runtime = site.runtime(JobToRun(f"bench-{uuid.uuid4().hex[:6]}", spec, INSTANCES, JobSettings()),
                               Cluster(10.0), time.monotonic)
        for instance in INSTANCES:
            runtime.start(instance.name, 0, 0)
        restarted = False
        deadline = time.monotonic() + cap_s
        while time.monotonic() < deadline:
            hear(runtime.poll())
            if not restarted and any(isinstance(e, InstanceExited) and e.exit_code != 0 for e in events):
                restarted = True  # the engine's decision: restart the job
                runtime.stop([i.name for i in INSTANCES])
                if mode == "recreate":
                    for pod in runtime.pods.values():
                        pod.bad = "recreated, as the peers restart"  # the next start replaces it
                for instance in INSTANCES:
                    runtime.start(instance.name, 1, 0)
            output = "\n".join(e.text for e in events if isinstance(e, LogLine))
            fault_t = torch_faults.parse(output)["fault_t"]
            again: dict[int, float] = {}  # each rank's first training step after the restart
            for match in torch_faults._LINE.finditer(output):
                if match["what"].startswith("step") and int(match["round"]) > 0:
                    again.setdefault(int(match["rank"]), float(match["t"]))
            if fault_t and set(again) == {0, 1}:
                runtime.finish()
                return {"seconds": max(again.values()) - fault_t, "pods_recreated": runtime.recreated,
                        "to_processes": max(started_at.values()) - fault_t,
                        "in_place": runtime.in_place}
            time.sleep(0.05)
        runtime.finish()
        tail = [e.text for e in events if isinstance(e, LogLine)][-5:]
        raise RuntimeError(f"{mode}: no training again within {cap_s} s; last lines {tail}; "
                           f"errors {runtime.errors} {runtime.last_error}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kubeconfig", default=None)
    args = parser.parse_args()
    api = KubeApi.connect(args.kubeconfig)
    namespace = f"twtest-{uuid.uuid4().hex[:6]}-bench"
    api.client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    time.sleep(2)  # its default ServiceAccount
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    try:
        for _ in range(args.repeat):
            for mode in MODES:  # interleaved: the machine's load falls on every mode alike
                results[mode].append(run_once(api, namespace, mode))
                print(f"{mode}: {results[mode][-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    finally:
        api.client.delete(Namespace, namespace)
    print(f"# SIGKILL of rank 1 to both ranks training again: torch DDP (gloo), one rank per pod, 2 pods "
          f"(median of {args.repeat})")
    print("| restart | s to every new process started | s to all ranks training again | runs | pods recreated |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        seconds = [r["seconds"] for r in results[mode]]
        each = ", ".join(f"{s:.2f}" for s in seconds)
        processes = statistics.median(r["to_processes"] for r in results[mode])
        print(f"| {mode} | {processes:.2f} | {statistics.median(seconds):.2f} | {each} | "
              f"{results[mode][0]['pods_recreated']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
