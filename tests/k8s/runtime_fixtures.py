"""What the kubernetes runtime's tests share: what a runtime says, as the
actuator service carries it out, a driver recording what reaches the pod hosts, and an
apiserver in this process (the API's paths and JSON, kept in memory) for the
tests that need no cluster."""

from __future__ import annotations

import json
import re
import time
import uuid

import httpx2
from lightkube import Client, KubeConfig
from lightkube.config.kubeconfig import Cluster as KubeCluster
from lightkube.config.kubeconfig import User

from trainwarden.events import NodeLost, Preempted
from trainwarden.runtime.base import AgentCommand, CapacityTaken, EngineError, JobEvent, JobToRun, NodeDown, NodeIsolated
from trainwarden.runtime.kubernetes.api import KubeApi
from trainwarden.runtime.nodes import Cluster
from trainwarden.settings import JobSettings


class Heard(list):
    """What a runtime said (runtime/base.py) as the actuator service carries
    it out: the job engine's events in this list, in order (``NodeDown`` as
    ``NodeLost``, ``CapacityTaken`` as ``Preempted``, a ``JobEvent``'s
    event), with when each was heard (``at``); its engine errors, isolations
    and agent commands beside, each drained from the runtime when read."""

    def __init__(self, runtime=None):
        super().__init__()
        self.runtime = runtime
        self.at: list[float] = []
        self._errors, self._isolated, self._commands = [], [], []

    def poll(self) -> None:
        self.take(self.runtime.poll())

    def take(self, said) -> None:
        for event in said:
            if isinstance(event, JobEvent):
                self._hear(event.event)
            elif isinstance(event, NodeDown):
                self._hear(NodeLost(job_id=self.runtime.job_id, time=self.runtime.clock(), node=event.node,
                                    instances=event.instances))
            elif isinstance(event, CapacityTaken):
                self._hear(Preempted(job_id=self.runtime.job_id, time=self.runtime.clock(), round=event.round,
                                     reason=event.reason))
            elif isinstance(event, EngineError):
                self._errors.append(event.text)
            elif isinstance(event, NodeIsolated):
                self._isolated.append((event.node, True, event.reason))
            elif isinstance(event, AgentCommand):
                self._commands.append(event.command)

    def _hear(self, event) -> None:
        self.at.append(time.monotonic())
        self.append(event)

    def _drained(self, kept: list) -> list:
        self.take(self.runtime.drain())
        return kept

    @property
    def errors(self) -> list:
        return self._drained(self._errors)

    @property
    def isolated(self) -> list:
        return self._drained(self._isolated)

    @property
    def commands(self) -> list:
        return self._drained(self._commands)


def kube_runtime(site, job_id, spec, instances, clock=time.monotonic):
    """The job's runtime as an actuator builds it (site.runtime), and what it says."""
    runtime = site.runtime(JobToRun(job_id, spec, tuple(instances), JobSettings()), Cluster(10.0), clock)
    return runtime, Heard(runtime)


def run_round(runtime, heard, clock, round_, instances):
    """Each instance's incarnation of the round started, and three turns of a second."""
    for spec in instances:
        runtime.start(spec.name, round_, 0)
    for _ in range(3):
        clock.advance(1.0)
        heard.poll()


class RecordingDriver:
    """The pod hosts as the agents would drive them: every run and stop, in order."""

    def __init__(self):
        self.runs, self.stops = [], []

    def ready(self, node, uid):
        return True

    def run(self, run):
        start = run.start
        self.runs.append((start.node, run.uid, start.instance.name, start.round, start.start, dict(run.env)))
        return []

    def stop(self, node, uid, grace_s):
        self.stops.append((node, uid))

    def poll(self):
        return []


class MemoryApiserver:
    """Pods and nodes in memory behind the API's paths; ``forbid`` (verb,
    resource) pairs are answered 403 as RBAC would; a created pod is
    scheduled at once on the first ready, untainted node its affinity allows."""

    def __init__(self, nodes=("n1", "n2"), namespaces=("default",)):
        self.nodes = {name: {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": {}},
                             "spec": {}, "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                                                    "conditions": [{"type": "Ready", "status": "True"}]}}
                      for name in nodes}
        self.namespaces = set(namespaces)
        self.pods: dict[tuple[str, str], dict] = {}
        self.forbid: set[tuple[str, str]] = set()
        self.deleted: list[str] = []
        self.calls: list[tuple[str, str]] = []  # (PATCH status | DELETE, pod name), in order
        self.gone: dict[str, dict] = {}  # deleted pods' last state, by name
        self.down = False  # every call answered 503, as an apiserver that is restarting

    def api(self) -> KubeApi:
        config = KubeConfig.from_one(cluster=KubeCluster(server="http://apiserver.test"), user=User(token="t"))
        return KubeApi(Client(config=config, transport=httpx2.MockTransport(self.handle)), "http://apiserver.test",
                       sleep=lambda s: None)

    def handle(self, request):
        path, method = request.url.path, request.method
        if self.down:
            return _status(503, "the apiserver is shutting down")
        body = json.loads(request.content) if request.content else None
        if path.endswith("/selfsubjectaccessreviews"):
            a = body["spec"]["resourceAttributes"]
            body["status"] = {"allowed": (a["verb"], a["resource"]) not in self.forbid}
            return httpx2.Response(201, json=body)
        match = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/status$", path)
        if match and method == "PATCH":
            if ("patch", "pods") in self.forbid:
                return _status(403, 'pods "status" is forbidden: cannot patch resource "pods/status"')
            pod = self.pods.get(match.groups())
            if pod is None:
                return _status(404, f'pods "{match.group(2)}" not found')
            self.calls.append(("PATCH status", match.group(2)))
            conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
            conditions.update({c["type"]: c for c in body["status"]["conditions"]})  # merged by type
            pod["status"]["conditions"] = list(conditions.values())
            return httpx2.Response(200, json=pod)
        match = re.match(r"^/api/v1/namespaces/([^/]+)(?:/pods(?:/([^/]+))?)?$", path)
        if match:
            namespace, name = match.groups()
            if namespace not in self.namespaces:
                return _status(404, f'namespaces "{namespace}" not found')
            if "/pods" not in path:
                return httpx2.Response(200, json={"kind": "Namespace", "apiVersion": "v1",
                                                  "metadata": {"name": namespace}})
            if method == "POST":
                if ("create", "pods") in self.forbid:
                    return _status(403, f'pods is forbidden: cannot create resource "pods" in the namespace "{namespace}"')
                return httpx2.Response(201, json=self._schedule(namespace, body))
            if method == "DELETE":
                self.deleted.append(name)
                self.calls.append(("DELETE", name))
                if (namespace, name) in self.pods:
                    self.gone[name] = self.pods[(namespace, name)]  # its last state
                return httpx2.Response(200, json=self.pods.pop((namespace, name), {"kind": "Status"}))
            key, _, value = request.url.params.get("labelSelector", "=").partition("=")
            items = [p for (ns, _), p in self.pods.items() if ns == namespace and p["metadata"]["labels"].get(key) == value]
            return httpx2.Response(200, json={"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
        match = re.match(r"^/api/v1/nodes(?:/([^/]+))?$", path)
        if match:
            name = match.group(1)
            if name is None:
                return httpx2.Response(200, json={"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                                                  "items": list(self.nodes.values())})
            if name not in self.nodes:
                return _status(404, f'nodes "{name}" not found')
            if method == "PATCH":
                _merge(self.nodes[name], body)
            return httpx2.Response(200, json=self.nodes[name])
        return _status(404, f"no route {method} {path}")

    def _schedule(self, namespace, pod):
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]
        avoid = set(terms.get("matchFields", [{}])[0].get("values", ()))
        for name, node in self.nodes.items():
            tainted = any(t["key"] == "trainwarden.io/isolated" for t in node["spec"].get("taints") or ())
            ready = node["status"]["conditions"][0]["status"] == "True"
            if name not in avoid and not tainted and ready and not node["spec"].get("unschedulable"):
                pod["spec"]["nodeName"] = name
                break
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["status"] = {"phase": "Running" if pod["spec"].get("nodeName") else "Pending",
                         "containerStatuses": [{"name": "instance", "image": "train:1", "imageID": "", "ready": True,
                                                 "restartCount": 0, "state": {"running": {}}}]}
        self.pods[(namespace, pod["metadata"]["name"])] = pod
        return pod

    def pods_named(self):
        return sorted(name for _, name in self.pods)


def _status(code, message):
    return httpx2.Response(code, json={"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": message, "code": code})


def _merge(target, patch):
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
