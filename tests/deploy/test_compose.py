"""deploy/docker-compose.yml: the whole stack on one Docker host. There is no
Docker engine here or in CI, so this checks the file's structure; where a
Compose CLI exists, `docker compose config` also validates it."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from trainwarden.store.server import parse_url
from tests.deploy.support import (
    COMPOSE,
    DEPLOY,
    KNOWN_SUBCOMMANDS,
    TRAINWARDEN_IMAGE,
    VECTOR_CONFIG,
    cli_subcommands,
    load_yaml,
    parse_cli,
)

CLICKHOUSE_STORE = "http://default@clickhouse:8123/trainwarden"


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_yaml(COMPOSE)


def _services(compose: dict) -> dict[str, dict]:
    return compose["services"]


def _trainwarden_services(compose: dict) -> dict[str, dict]:
    return {name: service for name, service in _services(compose).items() if service.get("image") == TRAINWARDEN_IMAGE}


def _depends(service: dict) -> dict[str, dict]:
    depends = service.get("depends_on", {})
    return {name: {} for name in depends} if isinstance(depends, list) else depends


def _argv(service: dict) -> list[str]:
    command = service["command"]
    return command.split() if isinstance(command, str) else [str(word) for word in command]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_file_says_at_the_top_that_ci_does_not_exercise_it():
    head = COMPOSE.read_text().split("\n\n", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines())
    assert "NOT EXERCISED IN THIS REPOSITORY'S CI" in head


def test_the_compose_file_parses_and_every_service_has_an_image_or_a_build(compose):
    assert {"kafka", "clickhouse", "grafana", "kafka-init", "processor", "actuator", "agent-node-a", "agent-node-b",
            "vector-node-a", "vector-node-b"} <= set(_services(compose))
    for name, service in _services(compose).items():
        assert service.get("image") or service.get("build"), name


def test_the_trainwarden_image_is_built_from_the_repository(compose):
    services = _trainwarden_services(compose)
    assert {"kafka-init", "processor", "actuator", "agent-node-a", "agent-node-b"} <= set(services)
    for name, service in services.items():
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}, name
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"(?m)^FROM python:3\.11-slim\s*$", dockerfile)
    assert re.search(r"(?m)^RUN pip install \.", dockerfile)
    for copied in ("pyproject.toml", "README.md", "pipeline", "rules"):  # what the wheel build reads
        assert re.search(rf"(?m)^COPY .*\b{re.escape(copied)}\b", dockerfile), copied


def test_the_kafka_service_is_a_single_kraft_node_without_zookeeper(compose):
    kafka = _services(compose)["kafka"]
    assert re.fullmatch(r"apache/kafka:\$\{KAFKA_VERSION:-4\.\d+\.\d+\}", kafka["image"])
    environment = kafka["environment"]
    assert set(environment["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert environment["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{environment['KAFKA_NODE_ID']}@kafka:")
    assert environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert not any("zookeeper" in name.lower() for name in _services(compose))
    assert not any("ZOOKEEPER" in key for key in environment)
    assert "healthcheck" in kafka
    # A cluster id is the base64url form of 16 bytes.
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", environment["CLUSTER_ID"])


def test_every_trainwarden_service_waits_for_kafka_and_the_services_for_the_topics(compose):
    for name, service in _trainwarden_services(compose).items():
        depends = _depends(service)
        assert depends["kafka"]["condition"] == "service_healthy", name
        if name != "kafka-init":
            assert depends["kafka-init"]["condition"] == "service_completed_successfully", name
    for name in ("vector-node-a", "vector-node-b"):
        assert "kafka" in _depends(_services(compose)[name])


@pytest.mark.parametrize("name", ["kafka-init", "processor", "actuator", "agent-node-a", "agent-node-b"])
def test_trainwarden_services_run_a_known_subcommand_with_arguments_the_cli_accepts(compose, name):
    argv = _argv(_services(compose)[name])
    assert argv[0] == "trainwarden"
    assert argv[1] in KNOWN_SUBCOMMANDS
    assert _flag(argv, "--bootstrap") == "kafka:9092"
    if argv[1] not in cli_subcommands():
        pytest.skip(f"'trainwarden {argv[1]}' is not in trainwarden.cli.main yet")
    assert parse_cli(argv[1:]) is None


def test_the_actuator_writes_the_history_to_clickhouse_with_the_password_outside_the_url(compose):
    services = _services(compose)
    actuator = services["actuator"]
    store = _flag(_argv(actuator), "--store")
    assert store == CLICKHOUSE_STORE
    assert parse_url(store)["database"] == "trainwarden"  # the store accepts it: no password in it
    clickhouse = services["clickhouse"]["environment"]
    assert actuator["environment"]["TRAINWARDEN_CLICKHOUSE_PASSWORD"] == clickhouse["CLICKHOUSE_PASSWORD"]
    assert clickhouse["CLICKHOUSE_DB"] == "trainwarden"
    assert _depends(actuator)["clickhouse"]["condition"] == "service_healthy"


def test_grafana_has_the_clickhouse_plugin_and_the_provisioning_directory(compose):
    grafana = _services(compose)["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in grafana["volumes"]}
    provisioning = DEPLOY / mounts["/etc/grafana/provisioning"]
    assert provisioning.is_dir()
    datasource = load_yaml(provisioning / "datasources" / "clickhouse.yaml")["datasources"][0]
    assert datasource["type"] == "grafana-clickhouse-datasource"
    assert datasource["jsonData"]["host"] == "clickhouse"
    assert datasource["jsonData"]["defaultDatabase"] == "trainwarden"
    variable = datasource["secureJsonData"]["password"].lstrip("$").strip("{}")
    assert variable in grafana["environment"]


def test_each_agent_has_its_own_log_volume_read_by_a_vector_that_names_the_same_node(compose):
    services = _services(compose)
    for node in ("node-a", "node-b"):
        agent, vector = services[f"agent-{node}"], services[f"vector-{node}"]
        argv = _argv(agent)
        assert _flag(argv, "--node") == node == agent["environment"]["TRAINWARDEN_NODE"]
        assert vector["environment"]["TRAINWARDEN_NODE"] == node
        log_dir = _flag(argv, "--log-dir")
        assert vector["environment"]["TRAINWARDEN_LOG_DIR"] == log_dir
        agent_volume = {v.split(":")[1]: v.split(":")[0] for v in agent["volumes"]}[log_dir]
        vector_volume = {v.split(":")[1]: v.split(":")[0] for v in vector["volumes"]}[log_dir]
        assert agent_volume == vector_volume == f"logs-{node}"
        assert vector["environment"]["TRAINWARDEN_KAFKA"] == "kafka:9092"


def test_vector_services_load_deploy_vector_vector_yaml_and_keep_their_data(compose):
    for node in ("node-a", "node-b"):
        vector = _services(compose)[f"vector-{node}"]
        assert vector["image"].startswith("timberio/vector:")
        mounts = {v.split(":")[1]: v.split(":")[0] for v in vector["volumes"]}
        argv = _argv(vector)
        config = _flag(argv, "--config")
        assert (DEPLOY / mounts[config]).resolve() == VECTOR_CONFIG
        assert mounts[vector["environment"]["VECTOR_DATA_DIR"]] in compose["volumes"]


def test_named_volumes_are_declared_and_bind_mounts_exist(compose):
    for name, service in _services(compose).items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"


def _has_compose_cli() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _has_compose_cli(), reason="no Docker Compose CLI here")
def test_docker_compose_config_accepts_the_file():
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
