"""The apiserver's answers as the runtime sees them: transient failures
retried and counted, the rest one sentence naming the call or permission.
An in-process HTTP transport answers as the apiserver does (Status objects);
no cluster needed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lightkube", reason="lightkube is not installed here (pip install -e '.[kubernetes]')")

import httpx2  # noqa: E402 - lightkube's HTTP client
from lightkube import Client, KubeConfig  # noqa: E402
from lightkube.config.kubeconfig import Cluster, User  # noqa: E402

from trainwarden.runtime.kubernetes.api import KubeApi, KubeError, KubeUnavailable  # noqa: E402


def _status(code, reason, message):
    return httpx2.Response(code, json={"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                       "message": message, "reason": reason, "code": code})


def _api(answers):
    """An API whose requests get ``answers`` in turn (the last one for ever)."""
    seen = []

    def handler(request):
        seen.append((request.method, request.url.path))
        answer = answers[min(len(seen) - 1, len(answers) - 1)]
        return answer(request) if callable(answer) else answer

    config = KubeConfig.from_one(cluster=Cluster(server="http://apiserver.test"), user=User(token="t"))
    client = Client(config=config, transport=httpx2.MockTransport(handler))
    return KubeApi(client, "http://apiserver.test", sleep=lambda s: None), seen


NODE_LIST = httpx2.Response(200, json={"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [
    {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"}}]})


def test_a_transient_apiserver_error_is_retried_and_counted():
    api, seen = _api([_status(503, "ServiceUnavailable", "etcd is restarting"),
                      _status(429, "TooManyRequests", "slow down"), NODE_LIST])
    assert [n["metadata"]["name"] for n in api.nodes()] == ["n1"]
    assert api.retries == 2 and len(seen) == 3


def test_an_apiserver_that_keeps_failing_is_unavailable_not_a_permanent_error():
    api, seen = _api([_status(503, "ServiceUnavailable", "etcd is restarting")])
    with pytest.raises(KubeUnavailable) as failed:
        api.nodes()
    assert not failed.value.permanent and "HTTP 503" in str(failed.value) and "list nodes" in str(failed.value)
    assert len(seen) == 4


def test_an_apiserver_that_is_down_is_said_in_one_sentence_naming_the_call():
    def refuse(request):
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)

    api, seen = _api([refuse])
    with pytest.raises(KubeUnavailable) as failed:
        api.pods("training", "trainwarden.io/job=j")
    text = str(failed.value)
    assert "does not answer" in text and "list pods in namespace training" in text and "\n" not in text
    assert api.retries == 3


def test_a_forbidden_call_names_the_verb_and_the_namespace_and_is_permanent():
    api, seen = _api([_status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:tw:actuator" '
                                               'cannot create resource "pods" in API group "" in the namespace "training"')])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "training"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    with pytest.raises(KubeError) as failed:
        api.create_pod(pod)
    assert failed.value.permanent and api.retries == 0
    assert str(failed.value).startswith("the actuator may not create pods in namespace training (forbidden")


def test_preflight_names_a_missing_namespace_before_anything_is_created():
    api, seen = _api([_status(404, "NotFound", 'namespaces "nope" not found')])
    with pytest.raises(KubeError, match="the namespace 'nope' does not exist on the cluster"):
        api.preflight("nope")
    assert all(method == "GET" for method, _ in seen)


def test_preflight_names_the_first_permission_rbac_denies():
    def review(request):
        attributes = json.loads(request.content)["spec"]["resourceAttributes"]
        allowed = not (attributes["resource"] == "nodes" and attributes["verb"] == "patch")
        return httpx2.Response(201, json={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                          "metadata": {}, "spec": {"resourceAttributes": attributes},
                                          "status": {"allowed": allowed}})

    api, seen = _api([httpx2.Response(200, json={"kind": "Namespace", "apiVersion": "v1",
                                                 "metadata": {"name": "training"}}), review])
    with pytest.raises(KubeError) as failed:
        api.preflight("training")
    assert str(failed.value) == "the actuator may not patch nodes (RBAC denies it)"
    assert "deploy/k8s" in failed.value.hint
