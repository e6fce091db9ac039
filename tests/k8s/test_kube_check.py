"""``python -m trainwarden.runtime.kubernetes.check JOB.yaml`` and
``trainwarden submit --runtime kubernetes JOB.yaml`` (the registry entry's
pre-submit check): a job the cluster cannot run is refused before anything
is created or submitted, in one sentence naming the field, the namespace or
the permission, exit 2. The section's
case needs no cluster; the others run against the real local cluster
(TRAINWARDEN_K8S=1 and KUBECONFIG; skipped, saying why, otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ON_CLUSTER = pytest.mark.skipif(
    not (os.environ.get("TRAINWARDEN_K8S") == "1" and os.environ.get("KUBECONFIG")),
    reason="needs the real local cluster: eval \"$(deploy/k8s/local-k8s start)\" and TRAINWARDEN_K8S=1")


def _job(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text("roles:\n  worker: {count: 2, command: [python, train.py]}\nkubernetes:\n" + section)
    return path


# Where no broker listens: a submit that got past its check would fail there, otherwise (exit 1, not 2).
NO_BUS = "127.0.0.1:9"
# The check module, and submit, which runs the same check through the registry.
VIA = pytest.mark.parametrize("via", ["check", "submit"])


def _check(job: Path, *extra: str, kubeconfig: str = "", via: str = "check") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    command = ([sys.executable, "-m", "trainwarden.runtime.kubernetes.check", str(job), *extra] if via == "check"
               else [sys.executable, "-c", "import sys; from trainwarden.cli.main import main; sys.exit(main())",
                     "submit", str(job), "--runtime", "kubernetes", "--bootstrap", NO_BUS, *extra])
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def _one_sentence(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_job_given_as_a_command_is_refused_by_submit_for_it_has_no_section():
    result = subprocess.run([sys.executable, "-c", "import sys; from trainwarden.cli.main import main; "
                             "sys.exit(main())", "submit", "--runtime", "kubernetes", "--bootstrap", NO_BUS, "--",
                             "python", "train.py"], capture_output=True, text=True, timeout=60)
    assert "needs a job file with a kubernetes: section" in _one_sentence(result)


@VIA
def test_a_malformed_section_is_refused_naming_the_field_and_exit_2(via, tmp_path):
    text = _one_sentence(_check(_job(tmp_path, "  image: train:1\n  namespace: Bad_Name\n"), kubeconfig="/nonexistent",
                                via=via))
    assert "job.yaml:5: 'kubernetes.namespace' 'Bad_Name' is not a namespace name" in text


@ON_CLUSTER
def test_a_job_the_cluster_can_run_passes(tmp_path):
    result = _check(_job(tmp_path, "  image: trainwarden.local/workload:1\n  namespace: default\n"))
    assert result.returncode == 0, result.stderr


@ON_CLUSTER
@VIA
def test_an_unknown_namespace_is_refused_in_one_sentence(via, tmp_path):
    text = _one_sentence(_check(_job(tmp_path, "  image: train:1\n  namespace: no-such-namespace\n"), via=via))
    assert "the namespace 'no-such-namespace' does not exist on the cluster" in text


@ON_CLUSTER
@VIA
def test_an_apiserver_that_is_down_is_refused_in_one_sentence_after_retrying(via, tmp_path):
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"  # nothing listens there
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    text = _one_sentence(_check(_job(tmp_path, "  image: train:1\n"), kubeconfig=str(dead), via=via))
    assert "the apiserver https://127.0.0.1:9 does not answer (ConnectError" in text
    assert "while trying to get namespace default" in text


@ON_CLUSTER
@VIA
def test_a_missing_permission_is_named(via, tmp_path):
    """The actuator's ServiceAccount (deploy/k8s/actuator-rbac.yaml) may run pods in the
    jobs namespace only: a job asking for another namespace is refused, naming the verb."""
    from lightkube import Client, KubeConfig
    from lightkube.core.exceptions import ApiError
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccount

    client = Client(KubeConfig.from_file(os.environ["KUBECONFIG"]))
    try:
        request = client.create(ServiceAccount.Token(metadata=ObjectMeta(name="trainwarden-actuator", namespace="trainwarden"),
                                                    spec=TokenRequestSpec(audiences=[], expirationSeconds=600)),
                                "trainwarden-actuator", namespace="trainwarden")
    except ApiError as exc:
        pytest.skip(f"the actuator's ServiceAccount is not on this cluster (apply deploy/k8s): {exc}")
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    config["users"][0]["user"] = {"token": request.status.token}
    actuator = tmp_path / "actuator.kubeconfig"
    actuator.write_text(yaml.safe_dump(config))
    granted = _check(_job(tmp_path, "  image: train:1\n  namespace: trainwarden-jobs\n"), kubeconfig=str(actuator))
    assert granted.returncode == 0, granted.stderr
    text = _one_sentence(_check(_job(tmp_path, "  image: train:1\n  namespace: default\n"), kubeconfig=str(actuator),
                                via=via))
    assert "the actuator may not create pods in namespace default (RBAC denies it)" in text
