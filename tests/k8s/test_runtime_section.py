"""The job file's ``kubernetes:`` section: pure, no cluster needed. Each
invalid case is one file under invalid_sections/, whose first line says
what the error must say; the error names the file and the field's line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainwarden.jobspec import load_job_file
from trainwarden.runtime.kubernetes.check import job_section
from trainwarden.runtime.kubernetes.section import HostPath, KubernetesSection, Toleration, from_wire, section_of
from trainwarden.yamlsrc import ConfigError

INVALID = sorted((Path(__file__).parent / "invalid_sections").glob("*.yaml"))


def _job_file(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text("roles:\n  worker: {count: 2, command: [python, train.py]}\nkubernetes:\n" + section)
    return path


def test_a_full_section_is_read_into_a_frozen_section_carried_with_the_job(tmp_path):
    job = load_job_file(_job_file(tmp_path, """\
  namespace: training
  service_account: trainer
  image: registry.example/team/train:1.4
  image_pull_policy: Never
  node_selector: {accelerator: a100, pool: spot}
  tolerations:
    - {key: gpu, operator: Exists, effect: NoSchedule}
    - {key: zone, value: b, effect: NoExecute, toleration_seconds: 30}
  resources: {nvidia.com/gpu: 1, cpu: 4, memory: 16Gi}
  host_paths: [/usr, /data:rw]
"""))
    section = job_section(str(tmp_path / "job.yaml"))
    assert section_of(job.spec()) == section  # what the actuator reads back from the bus
    assert section == KubernetesSection(
        image="registry.example/team/train:1.4", namespace="training", service_account="trainer",
        image_pull_policy="Never", node_selector=(("accelerator", "a100"), ("pool", "spot")),
        tolerations=(Toleration("gpu", "Exists", "", "NoSchedule"), Toleration("zone", "Equal", "b", "NoExecute", 30)),
        resources=(("cpu", "4"), ("memory", "16Gi"), ("nvidia.com/gpu", "1")),
        host_paths=(HostPath("/usr"), HostPath("/data", writable=True)))


def test_a_section_with_only_an_image_takes_the_defaults(tmp_path):
    job = load_job_file(_job_file(tmp_path, "  image: train:1\n"))
    section = from_wire(json.loads(job.runtime_options)["kubernetes"])
    assert (section.namespace, section.service_account, section.image_pull_policy) == ("default", "", "IfNotPresent")
    assert (section.pool_label, section.pool_taint) == ("trainwarden.io/pool", "trainwarden.io/pool")


def test_a_spot_pools_label_and_taint_are_the_job_files_to_name_and_the_taint_may_be_none(tmp_path):
    job = load_job_file(_job_file(tmp_path, "  image: train:1\n  pool_label: cloud.google.com/gke-spot\n"
                                            "  pool_taint: ''\n"))
    section = section_of(job.spec())
    assert (section.pool_label, section.pool_taint) == ("cloud.google.com/gke-spot", "")


def test_a_job_file_without_the_section_carries_no_engine_options(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("roles:\n  worker: {count: 1, command: [python, train.py]}\n")
    assert load_job_file(path).spec().runtime_options == ""


@pytest.mark.parametrize("case", INVALID, ids=[p.stem for p in INVALID])
def test_an_invalid_section_is_refused_in_one_sentence_naming_the_field_and_its_line(case):
    expected = re.match(r"# expect: (.*)", case.read_text()).group(1)
    with pytest.raises(ConfigError) as refused:
        job_section(str(case))
    message = str(refused.value)
    assert expected in message
    assert message.startswith(f"{case}:")  # the file and a line in it
    line = int(message[len(str(case)) + 1:].split(":", 1)[0])
    assert line >= 4  # the section starts on line 4 of every case
    assert "\n" not in message


def test_a_section_forged_on_the_bus_is_checked_as_strictly_as_the_file():
    with pytest.raises(ConfigError, match="is not a namespace name"):
        from_wire({"image": "train:1", "namespace": "../kube-system"})
    with pytest.raises(ConfigError, match="not a mapping"):
        from_wire(["image"])
