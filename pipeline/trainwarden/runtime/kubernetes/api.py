"""The apiserver, through lightkube (docs/DESIGN.md says why this client):
the few calls the runtime makes, on plain dicts (the API's JSON), with one
error type whose text is one sentence naming what failed.

A transient failure (the apiserver restarting: 429, 500, 502, 503, 504, a
refused or timed-out connection) is retried here a few times within about a
second and counted (``retries``); if it lasts, ``KubeUnavailable`` says so
and the runtime tries again on its next turn. Anything else (forbidden, a
namespace that does not exist, a refused manifest) is ``KubeError``,
``permanent``: trying again would not help.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ConfigError as LightkubeConfigError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.operators import exists as lightkube_exists
from lightkube.types import PatchType

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_S = (0.1, 0.3, 0.6)  # about a second in all: the actuator's loop must not stall
FIELD_MANAGER = "trainwarden"
# What the actuator does, and so the RBAC it needs (deploy/k8s/actuator-rbac.yaml grants these;
# not pods/eviction: evicting is how others preempt the job's pods, never the actuator's own way).
NEEDED = (("create", "pods", ""), ("delete", "pods", ""), ("list", "pods", ""), ("get", "pods", ""),
          ("watch", "pods", ""), ("get", "nodes", ""), ("list", "nodes", ""), ("watch", "nodes", ""),
          ("patch", "nodes", ""))
# A spot job's too: its release marks each pod DisruptionTarget (its status) before deleting it.
NEEDED_SPOT = (("patch", "pods", "status"),)
# A watch the apiserver ends after this long (a new one resumes at the version reached): the
# watching thread looks at least this often whether it is still wanted.
WATCH_SERVER_TIMEOUT_S = 30


class KubeError(Exception):
    """One sentence naming the call and what the apiserver said."""

    permanent = True

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class KubeUnavailable(KubeError):
    permanent = False


class KubeApi:
    def __init__(self, client: Client, server: str = "", sleep: Callable[[float], None] = time.sleep):
        self.client = client
        self.server = server
        self.sleep = sleep
        self.retries = 0  # transient failures retried (each attempt after the first)
        self.calls = 0

    @classmethod
    def connect(cls, kubeconfig: Optional[str] = None, timeout_s: float = 5.0) -> "KubeApi":
        """From a kubeconfig file (else $KUBECONFIG, ~/.kube/config or the pod's service account)."""
        try:
            config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        except (LightkubeConfigError, OSError) as exc:
            raise KubeError(f"cannot read the kubeconfig {kubeconfig or '(from the environment)'}: {exc}",
                            hint="give --kubeconfig or set KUBECONFIG") from None
        client = Client(config=config, timeout=httpx2.Timeout(timeout_s), field_manager=FIELD_MANAGER,
                        trust_env=False)
        server = config.get().cluster.server if config.current_context else ""
        return cls(client, server)

    # ------------------------------------------------------------ calls

    def create_pod(self, manifest: dict) -> dict:
        namespace = manifest["metadata"]["namespace"]
        return self._call(f"create pods in namespace {namespace}",
                          lambda: self.client.create(from_dict(manifest), namespace=namespace)).to_dict()

    def delete_pod(self, name: str, namespace: str, grace_s: Optional[int] = None) -> bool:
        """False when it was gone already."""
        try:
            self._call(f"delete pod {name} in namespace {namespace}",
                       lambda: self.client.delete(Pod, name, namespace=namespace, grace_period=grace_s))
        except KubeError as exc:
            if getattr(exc, "status", 0) == 404:
                return False
            raise
        return True

    def patch_pod_status(self, name: str, namespace: str, patch: dict) -> bool:
        """A strategic merge patch of the pod's status subresource; False when the pod is gone."""
        try:
            self._call(f"patch pods/status of {name} in namespace {namespace}", lambda: self.client.patch(
                Pod.Status, name, patch, namespace=namespace, patch_type=PatchType.STRATEGIC))
        except KubeError as exc:
            if getattr(exc, "status", 0) == 404:
                return False
            raise
        return True

    def pods(self, namespace: str, selector: str) -> list[dict]:
        key, _, value = selector.partition("=")
        return self._call(f"list pods in namespace {namespace}", lambda: [
            pod.to_dict() for pod in self.client.list(Pod, namespace=namespace, labels={key: value})])

    def listed(self, kind: str, namespace: str = "", selector: str = "") -> tuple[list[dict], str]:
        """Every pod of the namespace carrying the label (``key`` or ``key=value``), or
        every node, and the resource version the list was read at (a watch resumes there)."""
        where = f"pods in namespace {namespace}" if kind == "pods" else "nodes"
        labels = _labels(selector)

        def call():
            listing = (self.client.list(Pod, namespace=namespace, labels=labels) if kind == "pods"
                       else self.client.list(Node, labels=labels))
            items = [item.to_dict() for item in listing]
            return items, listing.resourceVersion
        return self._call(f"list {where}", call)

    def watch(self, kind: str, resource_version: str, namespace: str = "", selector: str = ""):
        """The changes after ``resource_version``, as (ADDED|MODIFIED|DELETED, object) pairs, until
        the connection ends. Errors are raised as they come (ApiError, httpx2.HTTPError): the
        watcher lists again (watch.py)."""
        labels = _labels(selector)
        if kind == "pods":
            changes = self.client.watch(Pod, namespace=namespace, labels=labels, resource_version=resource_version,
                                        server_timeout=WATCH_SERVER_TIMEOUT_S)
        else:
            changes = self.client.watch(Node, labels=labels, resource_version=resource_version,
                                        server_timeout=WATCH_SERVER_TIMEOUT_S)
        for change, obj in changes:
            yield change, obj.to_dict()

    def nodes(self) -> list[dict]:
        return self._call("list nodes", lambda: [node.to_dict() for node in self.client.list(Node)])

    def node(self, name: str) -> Optional[dict]:
        try:
            return self._call(f"get node {name}", lambda: self.client.get(Node, name)).to_dict()
        except KubeError as exc:
            if getattr(exc, "status", 0) == 404:
                return None
            raise

    def patch_node(self, name: str, patch: dict) -> dict:
        return self._call(f"patch node {name}", lambda: self.client.patch(
            Node, name, patch, patch_type=PatchType.MERGE)).to_dict()

    def evict(self, name: str, namespace: str) -> None:
        """The Eviction API, as ``kubectl drain`` uses it (tests; an operator's drain)."""
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        self._call(f"create pods/eviction of {name} in namespace {namespace}",
                   lambda: self.client.create(eviction, name=name, namespace=namespace))

    def namespace_exists(self, namespace: str) -> bool:
        try:
            self._call(f"get namespace {namespace}", lambda: self.client.get(Namespace, namespace))
        except KubeError as exc:
            if getattr(exc, "status", 0) == 404:
                return False
            if getattr(exc, "status", 0) == 403:
                return True  # may not read namespaces: the pods' own calls will say if it is missing
            raise
        return True

    def allowed(self, verb: str, resource: str, subresource: str, namespace: str) -> bool:
        """A SelfSubjectAccessReview: may this client do it? (Every user may ask.)"""
        attributes = {"verb": verb, "resource": resource, "group": ""}
        if subresource:
            attributes["subresource"] = subresource
        if resource != "nodes":
            attributes["namespace"] = namespace
        review = from_dict({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                            "spec": {"resourceAttributes": attributes}})
        answer = self._call("create selfsubjectaccessreviews", lambda: self.client.create(review))
        assert isinstance(answer, SelfSubjectAccessReview)
        return bool(answer.status and answer.status.allowed)

    def preflight(self, namespace: str, spot: bool = False) -> None:
        """Before anything of a job is created: the namespace exists and every
        verb the runtime uses is allowed (``spot``: a spot job's release's
        too). KubeError naming the first that is not."""
        if not self.namespace_exists(namespace):
            raise KubeError(f"the namespace {namespace!r} does not exist on the cluster",
                            hint=f"create it (kubectl create namespace {namespace}) or fix 'kubernetes.namespace'")
        for verb, resource, subresource in NEEDED + (NEEDED_SPOT if spot else ()):
            if not self.allowed(verb, resource, subresource, namespace):
                what = f"{resource}/{subresource}" if subresource else resource
                where = "" if resource == "nodes" else f" in namespace {namespace}"
                raise KubeError(f"the actuator may not {verb} {what}{where} (RBAC denies it)",
                                hint="apply deploy/k8s (the actuator's Role and ClusterRole) or grant that verb")

    # ------------------------------------------------------------ errors

    def _call(self, what: str, call):
        self.calls += 1
        for attempt in range(len(BACKOFF_S) + 1):
            try:
                return call()
            except ApiError as exc:
                code = exc.status.code or (exc.response.status_code if exc.response is not None else None)
                if code in TRANSIENT_STATUS and attempt < len(BACKOFF_S):
                    self._retry(attempt)
                    continue
                raise _api_error(what, code, exc) from None
            except httpx2.TransportError as exc:
                if attempt < len(BACKOFF_S):
                    self._retry(attempt)
                    continue
                raise KubeUnavailable(f"the apiserver {self.server or ''} does not answer ({type(exc).__name__}: "
                                      f"{str(exc)[:120]}) while trying to {what}".replace("  ", " "),
                                      hint="is the cluster up? (deploy/k8s/local-k8s status)") from None

    def _retry(self, attempt: int) -> None:
        self.retries += 1
        self.sleep(BACKOFF_S[attempt])


def _labels(selector: str) -> Optional[dict]:
    """``key=value`` or ``key`` (the label exists) as lightkube's selector."""
    if not selector:
        return None
    key, equals, value = selector.partition("=")
    return {key: value} if equals else {key: lightkube_exists()}


def _api_error(what: str, code: Optional[int], exc: ApiError) -> KubeError:
    message = (exc.status.message or exc.status.reason or "").strip().rstrip(".")[:300]
    if code in TRANSIENT_STATUS:
        error: KubeError = KubeUnavailable(f"the apiserver kept failing to {what} (HTTP {code}: {message})")
    elif code == 403:
        error = KubeError(f"the actuator may not {what} (forbidden: {message})",
                          hint="apply deploy/k8s (the actuator's Role and ClusterRole) or grant that verb")
    elif code == 404 and "namespaces" in message and "not found" in message:
        error = KubeError(f"cannot {what}: the namespace does not exist ({message})",
                          hint="create it or fix 'kubernetes.namespace'")
    elif code == 401:
        error = KubeError(f"the apiserver refused the actuator's credentials while trying to {what}",
                          hint="check the kubeconfig's user")
    else:
        error = KubeError(f"cannot {what} (HTTP {code}: {message})")
    error.status = code  # type: ignore[attr-defined]
    return error
