"""deploy/k8s: the Kubernetes manifests. Structural checks that need no
cluster: kinds, names, labels and selectors, images, the trainwarden
subcommands and flags the containers run, the variables their arguments
use, volumes, the generated ConfigMaps, and what the agent and Vector
DaemonSets share. `kubectl kustomize` runs where kubectl exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import (
    K8S,
    KNOWN_SUBCOMMANDS,
    ROOT,
    TRAINWARDEN_IMAGE,
    VECTOR_CONFIG,
    cli_subcommands,
    load_documents,
    load_yaml,
    parse_cli,
)

NAMESPACE = "trainwarden"
JOBS_NAMESPACE = "trainwarden-jobs"  # the kubernetes runtime's pods, and the actuator's Role there
KINDS = {  # what these manifests may contain, with the apiVersion of each kind
    "Namespace": "v1", "ConfigMap": "v1", "Secret": "v1", "PersistentVolumeClaim": "v1", "ServiceAccount": "v1",
    "Deployment": "apps/v1", "DaemonSet": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1",
    "Role": "rbac.authorization.k8s.io/v1", "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
MANIFEST_FILES = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
LOG_DIR = "/var/log/trainwarden"


def _documents() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in MANIFEST_FILES for doc in load_documents(path)]


DOCUMENTS = _documents()


def _operator_secrets() -> set[str]:
    """Secrets the operator creates (deploy/k8s/README.md says how): credentials never ship with the manifests."""
    return set(re.findall(r"kubectl -n trainwarden create secret generic ([a-z0-9-]+)",
                          (K8S / "README.md").read_text(encoding="utf-8")))


def _find(kind: str, name: str) -> dict:
    matches = [doc for _, doc in DOCUMENTS if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"exactly one {kind} {name}"
    return matches[0]


def _workloads() -> list[tuple[str, dict]]:
    return [(f"{doc['kind']} {doc['metadata']['name']}", doc) for _, doc in DOCUMENTS if doc["kind"] in WORKLOADS]


def _pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _containers(workload: dict) -> list[dict]:
    spec = _pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def _trainwarden_containers() -> list[tuple[str, dict, dict]]:
    return [(f"{label}/{container['name']}", workload, container) for label, workload in _workloads()
            for container in _containers(workload) if container["image"].startswith("ghcr.io/trainwarden/")]


def _argv(container: dict) -> list[str]:
    return [str(word) for word in container.get("command", []) + container.get("args", [])]


def _env_value(workload: dict, container: dict, name: str) -> str:
    """A plausible value of a container variable, to stand in for $(NAME)."""
    for entry in container.get("env", []):
        if entry["name"] != name:
            continue
        if "value" in entry:
            return str(entry["value"])
        source = entry["valueFrom"]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return str(_find("ConfigMap", ref["name"])["data"][ref["key"]])
        if "fieldRef" in source:
            return "10.0.0.5" if source["fieldRef"]["fieldPath"].endswith("IP") else "node-a"
        return "secret"
    raise AssertionError(f"{name} is not set in the container")


# ------------------------------------------------------------ every document


def test_there_are_manifests_for_every_part_of_the_deployment():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCUMENTS}
    assert {("Namespace", NAMESPACE), ("ConfigMap", "trainwarden-rules"), ("ConfigMap", "trainwarden-vector"),
            ("Deployment", "trainwarden-processor"), ("Deployment", "trainwarden-actuator"),
            ("DaemonSet", "trainwarden-agent"), ("DaemonSet", "trainwarden-vector"),
            ("Job", "trainwarden-kafka-init")} <= kinds


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.name)
def test_every_document_has_a_known_kind_its_api_version_and_a_name(path):
    documents = load_documents(path)
    assert documents, f"{path.name} holds no document"
    for doc in documents:
        assert doc.get("kind") in KINDS, f"{path.name}: unexpected kind {doc.get('kind')}"
        assert doc.get("apiVersion") == KINDS[doc["kind"]], f"{path.name}: {doc['kind']} is {KINDS[doc['kind']]}"
        name = doc.get("metadata", {}).get("name")
        assert isinstance(name, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), name


def test_every_namespaced_object_is_in_the_trainwarden_namespace_but_the_actuators_rights_on_job_pods():
    for file, doc in DOCUMENTS:
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], f"{file}: {doc['kind']} {doc['metadata']['name']}"
        elif doc["kind"] in ("Role", "RoleBinding"):
            assert doc["metadata"].get("namespace") == JOBS_NAMESPACE, f"{file}: {doc['kind']} {doc['metadata']['name']}"
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{file}: {doc['kind']} {doc['metadata']['name']}"


def test_names_are_unique_per_kind():
    seen = [(doc["kind"], doc["metadata"]["name"]) for _, doc in DOCUMENTS]
    assert len(seen) == len(set(seen))


def test_the_kustomization_lists_every_manifest_file():
    kustomization = load_yaml(K8S / "kustomization.yaml")
    # A `namespace:` would move the Role of the jobs namespace into the services' one.
    assert "namespace" not in kustomization
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFEST_FILES]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_kubectl_kustomize_builds_the_whole_deployment():
    result = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    built = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert len(built) == len(DOCUMENTS)


# ------------------------------------------------------------ workloads


@pytest.mark.parametrize("label,workload", _workloads(), ids=[label for label, _ in _workloads()])
def test_selector_labels_match_the_pod_template_labels(label, workload):
    template_labels = workload["spec"]["template"]["metadata"]["labels"]
    if workload["kind"] == "Job":
        return  # a Job's selector is generated
    selector = workload["spec"]["selector"]["matchLabels"]
    assert selector and set(selector.items()) <= set(template_labels.items()), label


@pytest.mark.parametrize("label,workload", _workloads(), ids=[label for label, _ in _workloads()])
def test_every_container_has_an_image_and_resource_requests(label, workload):
    for container in _containers(workload):
        assert container.get("image"), f"{label}/{container['name']}"
        assert ":" in container["image"].rsplit("/", 1)[-1], f"{label}: pin the image tag"
        requests = container["resources"]["requests"]
        assert requests.get("cpu") and requests.get("memory"), f"{label}/{container['name']}"
        if workload["metadata"]["name"] != "trainwarden-agent":
            # The agent's limits would also cap the training processes it starts.
            assert container["resources"]["limits"].get("memory"), f"{label}/{container['name']}"


def test_every_trainwarden_container_uses_the_one_trainwarden_image():
    assert {container["image"] for _, _, container in _trainwarden_containers()} == {TRAINWARDEN_IMAGE}


@pytest.mark.parametrize("label,workload", _workloads(), ids=[label for label, _ in _workloads()])
def test_volume_mounts_name_volumes_of_the_pod_and_the_volumes_exist(label, workload):
    volumes = {volume["name"]: volume for volume in _pod_spec(workload).get("volumes", [])}
    for container in _containers(workload):
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{label}/{container['name']} mounts unknown volume {mount['name']}"
    for volume in volumes.values():
        if "configMap" in volume:
            _find("ConfigMap", volume["configMap"]["name"])
        if "persistentVolumeClaim" in volume:
            _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        if "secret" in volume and volume["secret"]["secretName"] not in _operator_secrets():
            _find("Secret", volume["secret"]["secretName"])


@pytest.mark.parametrize("label,workload", _workloads(), ids=[label for label, _ in _workloads()])
def test_config_map_references_name_existing_keys(label, workload):
    for container in _containers(workload):
        for entry in container.get("env", []):
            ref = entry.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["key"] in _find("ConfigMap", ref["name"])["data"], f"{label}: {ref}"
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                _find("ConfigMap", source["configMapRef"]["name"])


@pytest.mark.parametrize("label,workload", _workloads(), ids=[label for label, _ in _workloads()])
def test_every_variable_in_a_command_is_defined_in_its_container(label, workload):
    # Kubernetes expands $(NAME) only for variables of the container's env.
    for container in _containers(workload):
        defined = {entry["name"] for entry in container.get("env", [])}
        for word in _argv(container):
            for name in re.findall(r"\$\((\w+)\)", word):
                assert name in defined, f"{label}/{container['name']}: $({name}) is not in env"


# ----------------------------------------------------------- Kafka security


def _kafka_login(workload: dict, container: dict) -> dict[str, str]:
    """The container's Kafka security settings, from its flags or its variables."""
    argv = _argv(container)
    settings = {}
    for setting in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD_FILE", "SSL_CAFILE"):
        flag = "--kafka-" + setting.lower().replace("_", "-")
        if flag in argv:
            settings[setting] = argv[argv.index(flag) + 1]
        elif any(e["name"] == f"TRAINWARDEN_KAFKA_{setting}" for e in container.get("env", [])):
            settings[setting] = _env_value(workload, container, f"TRAINWARDEN_KAFKA_{setting}")
    return settings


def _mounted_secret(workload: dict, container: dict, path: str) -> str:
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in _pod_spec(workload).get("volumes", [])}
    return volumes[mounts[str(Path(path).parent)]]["secret"]["secretName"]


@pytest.mark.parametrize("label,workload,container", _trainwarden_containers(),
                         ids=[label for label, _, _ in _trainwarden_containers()])
def test_every_trainwarden_container_logs_into_kafka_over_sasl_ssl_as_its_own_user_from_secret_files(
        label, workload, container):
    login = _kafka_login(workload, container)
    assert login.get("SECURITY_PROTOCOL") == "SASL_SSL" and login.get("SASL_MECHANISM") == "SCRAM-SHA-512", label
    user = login["SASL_USERNAME"]
    assert user == {"kafka": "cli"}.get(_argv(container)[1], _argv(container)[1]), label
    assert _mounted_secret(workload, container, login["SASL_PASSWORD_FILE"]) == f"trainwarden-kafka-{user}", label
    assert _mounted_secret(workload, container, login["SSL_CAFILE"]) == "trainwarden-kafka-ca", label
    assert not any(e["name"] == "TRAINWARDEN_KAFKA_SASL_PASSWORD" for e in container.get("env", [])), label


@pytest.mark.parametrize("label,workload,container", _trainwarden_containers(),
                         ids=[label for label, _, _ in _trainwarden_containers()])
def test_every_service_signs_with_the_keyring_of_a_mounted_secret(label, workload, container):
    argv = _argv(container)
    if argv[1] == "kafka":
        return  # kafka init produces no message
    keyring = (argv[argv.index("--signing-key-file") + 1] if "--signing-key-file" in argv
               else _env_value(workload, container, "TRAINWARDEN_SIGNING_KEY_FILE"))
    assert _mounted_secret(workload, container, keyring) == "trainwarden-signing-key", label


def test_no_secret_with_credentials_ships_with_the_manifests_and_the_readme_creates_every_mounted_one():
    assert not [doc for _, doc in DOCUMENTS if doc["kind"] == "Secret"]
    mounted = {v["secret"]["secretName"] for _, w in _workloads() for v in _pod_spec(w).get("volumes", [])
               if "secret" in v}
    assert mounted <= _operator_secrets(), mounted - _operator_secrets()


# ----------------------------------------------------- trainwarden commands


@pytest.mark.parametrize("label,workload,container", _trainwarden_containers(),
                         ids=[label for label, _, _ in _trainwarden_containers()])
def test_trainwarden_containers_run_a_known_trainwarden_subcommand(label, workload, container):
    argv = _argv(container)
    assert argv[0] == "trainwarden", label
    assert argv[1] in KNOWN_SUBCOMMANDS, f"{label}: unknown subcommand {argv[1]}"
    if argv[1] == "kafka":
        assert argv[2] == "init"


@pytest.mark.parametrize("label,workload,container", _trainwarden_containers(),
                         ids=[label for label, _, _ in _trainwarden_containers()])
def test_trainwarden_containers_pass_arguments_the_cli_accepts(label, workload, container):
    argv = _argv(container)[1:]
    if argv[0] not in cli_subcommands():
        pytest.skip(f"'trainwarden {argv[0]}' is not in trainwarden.cli.main yet")
    resolved = [re.sub(r"\$\((\w+)\)", lambda m: _env_value(workload, container, m.group(1)), word) for word in argv]
    error = parse_cli(resolved)
    assert error is None, f"{label}: trainwarden {' '.join(resolved)}: {error}"


def test_the_processor_runs_twice_and_the_actuator_once_never_two_at_a_time():
    assert _find("Deployment", "trainwarden-processor")["spec"]["replicas"] == 2
    actuator = _find("Deployment", "trainwarden-actuator")
    assert actuator["spec"]["replicas"] == 1
    assert actuator["spec"]["strategy"]["type"] == "Recreate"


def test_the_actuator_keeps_its_history_store_on_a_persistent_volume():
    actuator = _find("Deployment", "trainwarden-actuator")
    (container,) = actuator["spec"]["template"]["spec"]["containers"]
    argv = _argv(container)
    store = _env_value(actuator, container, "TRAINWARDEN_STORE") if argv[argv.index("--store") + 1] == \
        "$(TRAINWARDEN_STORE)" else argv[argv.index("--store") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in actuator["spec"]["template"]["spec"]["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[store]]


def test_the_processor_reads_the_rules_config_map():
    processor = _find("Deployment", "trainwarden-processor")
    (container,) = processor["spec"]["template"]["spec"]["containers"]
    argv = _argv(container)
    rules_dir = argv[argv.index("--rules") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in processor["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[rules_dir]]["configMap"]["name"] == "trainwarden-rules"


# ------------------------------------------------- agent and Vector DaemonSets


def _daemonset_container(name: str) -> tuple[dict, dict]:
    daemonset = _find("DaemonSet", name)
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return daemonset, container


def _host_path_of(daemonset: dict, container: dict, mount_path: str) -> str:
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    return volumes[mounts[mount_path]]["hostPath"]["path"]


def test_the_agent_and_vector_share_the_log_directory_through_the_same_host_path():
    agent, agent_container = _daemonset_container("trainwarden-agent")
    vector, vector_container = _daemonset_container("trainwarden-vector")
    argv = _argv(agent_container)
    assert argv[argv.index("--log-dir") + 1] == LOG_DIR
    assert _env_value(vector, vector_container, "TRAINWARDEN_LOG_DIR") == LOG_DIR
    assert _host_path_of(agent, agent_container, LOG_DIR) == _host_path_of(vector, vector_container, LOG_DIR)
    assert agent["spec"]["template"]["spec"]["nodeSelector"] == vector["spec"]["template"]["spec"]["nodeSelector"]


def test_the_agent_and_vector_take_the_node_name_from_the_downward_api():
    for name in ("trainwarden-agent", "trainwarden-vector"):
        _, container = _daemonset_container(name)
        (entry,) = [e for e in container["env"] if e["name"] == "TRAINWARDEN_NODE"]
        assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", name
    _, agent = _daemonset_container("trainwarden-agent")
    argv = _argv(agent)
    assert argv[argv.index("--node") + 1] == "$(TRAINWARDEN_NODE)"
    assert argv[argv.index("--slots") + 1] == "$(TRAINWARDEN_SLOTS)"
    # The address other nodes' instances reach this node's at: the node IP
    # (the pod runs in the host network), not whatever the host name resolves to.
    assert argv[argv.index("--address") + 1] == "$(TRAINWARDEN_ADDRESS)"
    (address,) = [e for e in agent["env"] if e["name"] == "TRAINWARDEN_ADDRESS"]
    assert address["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert _find("DaemonSet", "trainwarden-agent")["spec"]["template"]["spec"]["hostNetwork"] is True


def test_vector_keeps_its_checkpoints_and_buffer_on_the_host_and_loads_the_vector_config_map():
    vector, container = _daemonset_container("trainwarden-vector")
    data_dir = _env_value(vector, container, "VECTOR_DATA_DIR")
    assert _host_path_of(vector, container, data_dir)
    argv = _argv(container)
    config_path = Path(argv[argv.index("--config") + 1])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in vector["spec"]["template"]["spec"]["volumes"]}
    config_map = _find("ConfigMap", volumes[mounts[str(config_path.parent)]]["configMap"]["name"])
    assert config_path.name in config_map["data"]
    # Its health probe is Vector's API, on the address the config binds.
    assert _env_value(vector, container, "VECTOR_API_ADDRESS").endswith(":8686")
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_every_service_container_is_probed_on_its_health_and_readiness_endpoints():
    probed = []
    for label, _, container in _trainwarden_containers():
        if not {"agent", "processor", "actuator", "notifier"} & set(_argv(container)[:2]):
            continue  # one-shot jobs (kafka init) have no endpoint
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert "metrics" in ports, f"{label}: no metrics port"
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, label
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, label
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz", label
        probed.append(label)
    assert len(probed) >= 3, probed  # agent, processor, actuator


# ---------------------------------------------------- generated ConfigMaps


def _generator():
    spec = importlib.util.spec_from_file_location("generate_configmaps", K8S / "generate_configmaps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_config_map_holds_exactly_the_rule_files():
    data = _find("ConfigMap", "trainwarden-rules")["data"]
    expected = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "rules").glob("*.yaml"))}
    assert data == expected, "rules/ changed: run python3 deploy/k8s/generate_configmaps.py"


def test_the_vector_config_map_holds_deploy_vector_vector_yaml():
    data = _find("ConfigMap", "trainwarden-vector")["data"]
    assert data == {"vector.yaml": VECTOR_CONFIG.read_text(encoding="utf-8")}, \
        "deploy/vector/vector.yaml changed: run python3 deploy/k8s/generate_configmaps.py"


def test_the_generated_config_maps_are_what_the_generator_writes():
    for path, text in _generator().render().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name}: run python3 deploy/k8s/generate_configmaps.py"


def test_the_rules_config_map_mounted_as_kubernetes_does_loads_as_the_rule_pack(tmp_path):
    from trainwarden.rules.loader import load_rules

    # A ConfigMap volume: a timestamped directory, a ..data link to it, and
    # one link per key to ..data/key.
    data = _find("ConfigMap", "trainwarden-rules")["data"]
    version = tmp_path / "..2025_11_29_07_06_40.000000001"
    version.mkdir()
    (tmp_path / "..data").symlink_to(version.name)
    for name, text in data.items():
        (version / name).write_text(text, encoding="utf-8")
        (tmp_path / name).symlink_to(f"..data/{name}")
    mounted, shipped = load_rules(tmp_path), load_rules(ROOT / "rules")
    assert [c.name for c in mounted.classifiers] == [c.name for c in shipped.classifiers]


def test_every_object_matches_the_kubernetes_schema_where_kubernetes_validate_is_installed():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed here (optional: pip install "
                                      "kubernetes-validate)")
    for file, doc in DOCUMENTS:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


# ------------------------------------------------------------ the kubernetes runtime's rights


def _rules(kind: str, name: str) -> dict[tuple[str, str], set[str]]:
    return {(group, resource): set(rule["verbs"]) for rule in _find(kind, name)["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]}


def test_the_actuator_may_use_pods_and_events_of_the_jobs_namespace_and_nodes_and_nothing_else():
    assert _find("Namespace", JOBS_NAMESPACE)
    assert _rules("Role", "trainwarden-actuator") == {
        ("", "pods"): {"create", "get", "list", "watch", "patch", "delete"},
        ("", "pods/status"): {"patch"},  # a spot release's DisruptionTarget
        ("", "events"): {"create"},
    }
    assert _rules("ClusterRole", "trainwarden-actuator-nodes") == {("", "nodes"): {"get", "list", "watch", "patch"}}
    subject = {"kind": "ServiceAccount", "name": "trainwarden-actuator", "namespace": NAMESPACE}
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        (binding,) = [doc for _, doc in DOCUMENTS if doc["kind"] == kind]
        assert binding["roleRef"]["kind"] == role_kind and binding["subjects"] == [subject]
    actuator = _pod_spec(_find("Deployment", "trainwarden-actuator"))
    assert actuator["serviceAccountName"] == "trainwarden-actuator" and actuator["automountServiceAccountToken"]
    assert _find("ServiceAccount", "trainwarden-actuator")


def test_the_agent_sees_the_hosts_processes_may_trace_them_and_reads_the_pod_logs_only():
    agent, container = _daemonset_container("trainwarden-agent")
    spec = agent["spec"]["template"]["spec"]
    assert spec["hostPID"] and spec["hostNetwork"]
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE"]
    assert not container["securityContext"].get("privileged")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/log/pods"]
    assert mount["readOnly"] is True
    assert _host_path_of(agent, container, "/var/log/pods") == "/var/log/pods"
