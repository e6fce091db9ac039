"""Pure pod manifests and node patches: what the runtime sends the apiserver."""

from __future__ import annotations

import re

from trainwarden.events import InstanceSpec
from trainwarden.runtime.kubernetes.manifests import (
    isolate_patch,
    label_value,
    pod_manifest,
    pod_name,
    uncordon_patch,
    with_isolation_taint,
)
from trainwarden.runtime.kubernetes.section import HostPath, KubernetesSection, Toleration

SECTION = KubernetesSection(image="train:1", namespace="training", image_pull_policy="Never",
                            node_selector=(("pool", "gpu"),), tolerations=(Toleration("gpu", "Exists"),),
                            resources=(("nvidia.com/gpu", "1"),), host_paths=(HostPath("/usr"), HostPath("/data", True)))
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _pod(**overrides):
    args = dict(job_id="Mnist_Demo.2026", spec=InstanceSpec("worker-1", "worker", 1, 1), world_size=2, generation=0,
                round_=3, section=SECTION, command=["python", "-m", "trainwarden.runtime.kubernetes.pod_host"],
                env={"TRAINWARDEN_JOB_ID": "Mnist_Demo.2026"}, master_addr="10.0.0.7", master_port=23456)
    args.update(overrides)
    return pod_manifest(**args)


def _env(pod):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_a_pod_is_labelled_with_its_job_role_index_and_round_and_named_as_kubernetes_allows():
    pod = _pod()
    meta = pod["metadata"]
    assert meta["labels"] == {"trainwarden.io/job": "Mnist_Demo.2026", "trainwarden.io/role": "worker",
                              "trainwarden.io/index": "1", "trainwarden.io/round": "3"}
    assert meta["annotations"]["trainwarden.io/job-id"] == "Mnist_Demo.2026"
    assert DNS_1123.match(meta["name"]) and len(meta["name"]) <= 63
    assert meta["namespace"] == "training"


def test_two_jobs_whose_ids_differ_only_in_case_get_different_pod_names():
    assert pod_name("Job-A", "worker-0", 0) != pod_name("job-a", "worker-0", 0)
    assert pod_name("job", "worker-0", 0) != pod_name("job", "worker-0", 1)


def test_a_job_id_no_label_may_hold_gets_a_readable_label_with_a_digest():
    value = label_value("x" * 100 + "_")
    assert len(value) <= 63 and re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", value)
    assert label_value("x" * 100 + "_") != label_value("x" * 100 + ".")


def test_the_pod_carries_the_rendezvous_of_the_rank_0_pod_and_the_node_name_from_the_downward_api():
    env = _env(_pod())
    assert env["MASTER_ADDR"] == "10.0.0.7" and env["MASTER_PORT"] == "23456"
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["TRAINWARDEN_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TRAINWARDEN_JOB_ID"] == "Mnist_Demo.2026"
    assert "TRAINWARDEN_TOKEN" not in env  # an incarnation's token comes with its run, never in the pod's spec


def test_the_pod_runs_on_the_host_network_never_restarted_by_the_kubelet_with_the_sections_choices():
    spec = _pod()["spec"]
    container = spec["containers"][0]
    assert spec["hostNetwork"] is True and spec["restartPolicy"] == "Never"
    assert container["image"] == "train:1" and container["imagePullPolicy"] == "Never"
    assert container["resources"] == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    mounts = {m["mountPath"]: m.get("readOnly") for m in container["volumeMounts"]}
    assert mounts["/usr"] is True and mounts["/data"] is False


def test_the_pod_keeps_off_isolated_nodes_and_the_nodes_the_runtime_avoids():
    terms = _pod(avoid_nodes=["n2", "n1", "n2"])["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "trainwarden.io/isolated", "operator": "DoesNotExist"}],
                      "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}]}]


def test_isolating_cordons_taints_labels_and_says_why_and_uncordon_removes_only_what_trainwarden_added():
    patch = isolate_patch("C4D: NCCL error on rank 1")
    assert patch["spec"]["unschedulable"] is True
    assert patch["metadata"]["annotations"]["trainwarden.io/isolated-reason"] == "C4D: NCCL error on rank 1"
    theirs = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    taints = with_isolation_taint([theirs, {"key": "trainwarden.io/isolated", "effect": "NoSchedule"}], "why")
    assert taints == [theirs, {"key": "trainwarden.io/isolated", "value": "true", "effect": "NoSchedule"}]
    back = uncordon_patch(taints)
    assert back["spec"] == {"unschedulable": False, "taints": [theirs]}
    assert back["metadata"] == {"labels": {"trainwarden.io/isolated": None},
                                "annotations": {"trainwarden.io/isolated-reason": None}}
