"""deploy/k8s as Prometheus sees it: every Trainwarden service pod is
annotated for scraping on the port its --metrics-address listens on, and
the opt-in notifier (deploy/k8s/notifier) is a whole, valid deployment: the
CLI accepts its arguments, its volumes exist, its subscriptions load."""

from __future__ import annotations

import re

import pytest

from trainwarden.notify import load_subscriptions
from tests.deploy.support import K8S, TRAINWARDEN_IMAGE, load_documents, load_yaml, parse_cli

SERVICES = ("agent", "processor", "actuator", "notifier")
NOTIFIER = K8S / "notifier"


def _documents() -> list[dict]:
    paths = sorted(K8S.glob("*.yaml")) + sorted(NOTIFIER.glob("*.yaml"))
    return [doc for path in paths if path.name != "kustomization.yaml" for doc in load_documents(path)]


def _service_workloads() -> list[tuple[str, dict, dict]]:
    found = []
    for doc in _documents():
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            argv = [str(w) for w in container.get("command", []) + container.get("args", [])]
            if argv[:1] == ["trainwarden"] and argv[1] in SERVICES:
                found.append((argv[1], doc, container))
    return found


def _argv(container: dict) -> list[str]:
    return [str(w) for w in container["command"] + container["args"]]


def test_every_service_runs_in_the_manifests():
    assert sorted(name for name, _, _ in _service_workloads()) == sorted(SERVICES)


@pytest.mark.parametrize("name,workload,container", _service_workloads(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_service_pod_is_scraped_on_the_port_its_metrics_address_listens_on(name, workload, container):
    argv = _argv(container)
    address = argv[argv.index("--metrics-address") + 1]
    port = address.rsplit(":", 1)[1]
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port and annotations["prometheus.io/path"] == "/metrics"
    assert {"name": "metrics", "containerPort": int(port)} in container["ports"]
    assert argv[argv.index("--log-format") + 1] == "json"


def test_the_notifier_deployment_is_valid_for_the_cli_and_its_volumes_and_config_exist():
    kustomization = load_yaml(NOTIFIER / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in NOTIFIER.glob("*.yaml")
                                                         if p.name != "kustomization.yaml")
    assert kustomization["images"] == load_yaml(K8S / "kustomization.yaml")["images"]
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _documents()}
    notifier = docs[("Deployment", "trainwarden-notifier")]
    assert notifier["spec"]["replicas"] == 1 and notifier["spec"]["strategy"]["type"] == "Recreate"
    (container,) = notifier["spec"]["template"]["spec"]["containers"]
    assert container["image"] == TRAINWARDEN_IMAGE
    argv = _argv(container)
    resolved = [re.sub(r"\$\((\w+)\)", "kafka:9092", word) for word in argv[1:]]
    assert parse_cli(resolved) is None, parse_cli(resolved)
    assert {e["name"] for e in container["env"]} >= set(re.findall(r"\$\((\w+)\)", " ".join(argv)))
    volumes = {v["name"]: v for v in notifier["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    config_map = docs[("ConfigMap", volumes[mounts[argv[argv.index("--notifications") + 1]]]["configMap"]["name"])]
    claim = volumes[mounts["/var/lib/trainwarden/notifier"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in docs
    for flag in ("--notify-dir", "--store"):
        assert argv[argv.index(flag) + 1].startswith("/var/lib/trainwarden/notifier/"), flag
    assert docs[("ConfigMap", "trainwarden-config")]["data"]["TRAINWARDEN_KAFKA"]
    assert config_map["metadata"]["namespace"] == "trainwarden" == notifier["metadata"]["namespace"]


def test_the_notifiers_subscriptions_config_map_loads_as_a_subscriptions_directory(tmp_path):
    (config_map,) = load_documents(NOTIFIER / "notifications-configmap.yaml")
    for key, text in config_map["data"].items():
        (tmp_path / key).write_text(text, encoding="utf-8")
    subscriptions = load_subscriptions(tmp_path)
    assert len(subscriptions) >= 1 and not any(s.enabled for s in subscriptions)  # a starter, switched off
