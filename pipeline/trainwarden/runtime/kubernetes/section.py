"""The ``kubernetes:`` section of a job file: where and how its pods run.

    kubernetes:
      namespace: training              # default: default
      service_account: trainer         # default: the namespace's default
      image: registry.example/train:1  # required
      image_pull_policy: IfNotPresent  # Always, IfNotPresent (default), Never
      node_selector: {gpu: a100}
      tolerations:
        - {key: gpu, operator: Exists, effect: NoSchedule}
      resources: {nvidia.com/gpu: 1, cpu: "4", memory: 16Gi}   # requests = limits
      host_paths: [/usr, /data:rw]     # hostPath volumes at the same path (read-only unless :rw)
      pool_label: trainwarden.io/pool  # a spot role's pods select the nodes labelled <pool_label>=<its pool>
      pool_taint: trainwarden.io/pool  # and tolerate the taint <pool_taint>=<its pool> ("" tolerates none)

Strict like the rest of the job file: an unknown key, a value of the wrong
kind or a name Kubernetes would refuse is one error naming the field and its
line, with a hint, before anything is sent to the apiserver. Pure: it reads
an already-loaded mapping (``yamlsrc.LineDict``), never a file.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from trainwarden.events import JobSpec
from trainwarden.limits import quote
from trainwarden.yamlsrc import ConfigError, Fields

# What Trainwarden puts on a node it isolates (isolation.py); a job tolerating
# it would land on exactly the nodes taken out of service.
ISOLATED_TAINT = "trainwarden.io/isolated"
# A spot role's pods go to its market pool's nodes: those labelled <POOL_KEY>=<pool>, whose taint
# <POOL_KEY>=<pool> (any effect) they tolerate. Both keys are the job's to change (a cloud's own
# spot label and taint, e.g. cloud.google.com/gke-spot).
POOL_KEY = "trainwarden.io/pool"

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
OPERATORS = ("Exists", "Equal")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# RFC 1123 label (namespaces) and subdomain (service accounts), as the apiserver checks them.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A qualified name: an optional DNS subdomain prefix and "/", then 1-63 of [A-Za-z0-9_.-] (label keys, resources).
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
# resource.Quantity: a decimal with an optional exponent or SI/binary suffix.
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")
MAX_ENTRIES = 64  # node selector labels, tolerations, resources, host paths: each


@dataclasses.dataclass(frozen=True)
class Toleration:
    key: str
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect
    toleration_seconds: int | None = None

    def manifest(self) -> dict:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.operator == "Equal":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclasses.dataclass(frozen=True)
class HostPath:
    path: str
    writable: bool = False


@dataclasses.dataclass(frozen=True)
class KubernetesSection:
    image: str
    namespace: str = "default"
    service_account: str = ""
    image_pull_policy: str = "IfNotPresent"
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    resources: tuple[tuple[str, str], ...] = ()
    host_paths: tuple[HostPath, ...] = ()
    pool_label: str = POOL_KEY
    pool_taint: str = POOL_KEY  # "": a spot role's pods tolerate no pool taint

    def to_wire(self) -> dict:
        """Plain data for the job's spec on the bus (from_wire reads it back, checked again)."""
        return {"image": self.image, "namespace": self.namespace, "service_account": self.service_account,
                "image_pull_policy": self.image_pull_policy, "node_selector": dict(self.node_selector),
                "tolerations": [dataclasses.asdict(t) for t in self.tolerations],
                "resources": dict(self.resources),
                "host_paths": [p.path + (":rw" if p.writable else "") for p in self.host_paths],
                "pool_label": self.pool_label, "pool_taint": self.pool_taint}


def parse_section(mapping: Any, path: str = "<kubernetes>", line: int = 0) -> KubernetesSection:
    """The ``kubernetes:`` mapping of a job file, checked; ConfigError naming the field otherwise."""
    top = Fields(mapping, path, "the 'kubernetes' section", line,
                 known=("namespace", "service_account", "image", "image_pull_policy", "node_selector",
                        "tolerations", "resources", "host_paths", "pool_label", "pool_taint"))
    image = top.get("image", str, ..., "an image reference")
    if not IMAGE.match(image):
        raise top.error("image", f"'kubernetes.image' {quote(image)} is not an image reference",
                        hint="e.g. registry.example/team/train:1.4 (no spaces)")
    namespace = top.get("namespace", str, "default")
    if not DNS_LABEL.match(namespace):
        raise top.error("namespace", f"'kubernetes.namespace' {quote(namespace)} is not a namespace name",
                        hint="at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit")
    account = top.get("service_account", str, "")
    if account and not DNS_SUBDOMAIN.match(account):
        raise top.error("service_account", f"'kubernetes.service_account' {quote(account)} is not a service "
                        "account name", hint="lowercase letters, digits, '-' and '.'")
    policy = top.get("image_pull_policy", str, "IfNotPresent")
    if policy not in PULL_POLICIES:
        raise top.error("image_pull_policy", f"'kubernetes.image_pull_policy' must be one of "
                        f"{', '.join(PULL_POLICIES)}, not {quote(policy)}")
    section = KubernetesSection(
        image=image, namespace=namespace, service_account=account, image_pull_policy=policy,
        node_selector=_node_selector(top), tolerations=_tolerations(top, path),
        resources=_resources(top), host_paths=_host_paths(top), pool_label=_pool_key(top, "pool_label"),
        pool_taint=_pool_key(top, "pool_taint"))
    top.done()
    return section


def from_wire(data: Any) -> KubernetesSection:
    """The section as the actuator receives it (to_wire's output); checked as
    strictly as the file, since the bus is input too."""
    if not isinstance(data, dict):
        raise ConfigError("the job's kubernetes section is not a mapping", "the submitted job")
    tolerations = data.get("tolerations")
    if isinstance(tolerations, list):
        data = {**data, "tolerations": [{k: v for k, v in t.items() if v is not None} if isinstance(t, dict) else t
                                        for t in tolerations]}
    return parse_section(data, "the submitted job")


def section_of(spec: JobSpec) -> KubernetesSection:
    """The section a submitted job carries (jobspec's ``runtime_options``), checked."""
    try:
        options = json.loads(spec.runtime_options) if spec.runtime_options else {}
    except ValueError:
        options = None
    if not isinstance(options, dict) or "kubernetes" not in options:
        raise ConfigError("the job has no kubernetes: section; the kubernetes runtime needs at least its image",
                          "the submitted job", hint="add 'kubernetes: {image: ...}' to the job file")
    return from_wire(options["kubernetes"])


def _count(fields: Fields, key: str, items) -> None:
    if len(items) > MAX_ENTRIES:
        raise fields.error(key, f"'kubernetes.{key}' has {len(items)} entries; at most {MAX_ENTRIES}")


def _node_selector(top: Fields) -> tuple[tuple[str, str], ...]:
    raw = top.get("node_selector", dict, {})
    _count(top, "node_selector", raw)
    pairs = []
    for key, value in raw.items():
        if not isinstance(key, str) or not QUALIFIED.match(key):
            raise top.error("node_selector", f"'kubernetes.node_selector': {quote(key)} is not a label key",
                            hint="e.g. nvidia.com/gpu.product or accelerator")
        if isinstance(value, (dict, list)) or value is None or not LABEL_VALUE.match(str(value)):
            raise top.error("node_selector", f"'kubernetes.node_selector.{key}': {quote(value)} is not a label "
                            "value", hint="at most 63 letters, digits, '-', '_' and '.'")
        pairs.append((key, str(value).lower() if isinstance(value, bool) else str(value)))
    return tuple(sorted(pairs))


def _tolerations(top: Fields, path: str) -> tuple[Toleration, ...]:
    raw = top.get("tolerations", list, [])
    _count(top, "tolerations", raw)
    out = []
    for index, item in enumerate(raw):
        where = f"'kubernetes.tolerations[{index}]'"
        line = raw.line_of(index) if hasattr(raw, "line_of") else 0
        entry = Fields(item, path, where, line, known=("key", "operator", "value", "effect", "toleration_seconds"))
        key = entry.get("key", str, "")
        operator = entry.get("operator", str, "Equal")
        if operator not in OPERATORS:
            raise entry.error("operator", f"{where}: 'operator' must be Exists or Equal, not {quote(operator)}")
        if not key and operator != "Exists":
            raise entry.error(None, f"{where} has no 'key'", hint="only operator: Exists may leave the key out")
        if key and not QUALIFIED.match(key):
            raise entry.error("key", f"{where}: {quote(key)} is not a taint key")
        if not key or key == ISOLATED_TAINT:
            raise entry.error("key", f"{where} tolerates {ISOLATED_TAINT}, the taint on nodes Trainwarden isolated",
                              hint="name the taints the job may tolerate; isolated nodes must stay out of its rounds")
        value = entry.get("value", (str, int, float), "")
        if operator == "Exists" and value != "":
            raise entry.error("value", f"{where}: operator Exists takes no 'value'")
        effect = entry.get("effect", str, "")
        if effect and effect not in EFFECTS:
            raise entry.error("effect", f"{where}: 'effect' must be one of {', '.join(EFFECTS)}, not {quote(effect)}")
        seconds = entry.get("toleration_seconds", int, None)
        if seconds is not None and effect != "NoExecute":
            raise entry.error("toleration_seconds", f"{where}: 'toleration_seconds' applies only to effect NoExecute")
        out.append(Toleration(key, operator, str(value), effect, seconds))
    return tuple(out)


def _resources(top: Fields) -> tuple[tuple[str, str], ...]:
    raw = top.get("resources", dict, {})
    _count(top, "resources", raw)
    out = []
    for name, amount in raw.items():
        if not isinstance(name, str) or not QUALIFIED.match(name):
            raise top.error("resources", f"'kubernetes.resources': {quote(name)} is not a resource name",
                            hint="e.g. cpu, memory, nvidia.com/gpu")
        text = str(amount) if isinstance(amount, (int, float)) and not isinstance(amount, bool) else amount
        if not isinstance(text, str) or not QUANTITY.match(text):
            raise top.error("resources", f"'kubernetes.resources.{name}': {quote(amount)} is not a quantity",
                            hint="e.g. 1, 500m, 16Gi")
        if "/" in name and not re.match(r"^\d+$", text):
            # Extended resources (GPUs) are whole units; the apiserver refuses fractions.
            raise top.error("resources", f"'kubernetes.resources.{name}' must be a whole number, not {quote(amount)}")
        out.append((name, text))
    return tuple(sorted(out))


def _pool_key(top: Fields, key: str) -> str:
    """pool_label (required to be a key) or pool_taint ("" for none): a label or taint key, never the isolation's."""
    value = top.get(key, str, POOL_KEY)
    if key == "pool_taint" and value == "":
        return value
    if not QUALIFIED.match(value):
        raise top.error(key, f"'kubernetes.{key}' {quote(value)} is not a {key.split('_')[1]} key",
                        hint=f"e.g. {POOL_KEY} (the default) or a cloud's own, such as cloud.google.com/gke-spot")
    if value == ISOLATED_TAINT:
        raise top.error(key, f"'kubernetes.{key}' is {ISOLATED_TAINT}, the key of nodes Trainwarden isolated",
                        hint=f"name the key the spot pools' nodes carry, e.g. {POOL_KEY}")
    return value


def _host_paths(top: Fields) -> tuple[HostPath, ...]:
    raw = top.get("host_paths", list, [])
    _count(top, "host_paths", raw)
    out = []
    for item in raw:
        if not isinstance(item, str):
            raise top.error("host_paths", f"'kubernetes.host_paths': {quote(item)} is not a path",
                            hint="an absolute path, with ':rw' to mount it writable")
        path, _, mode = item.partition(":")
        if not path.startswith("/") or mode not in ("", "ro", "rw") or ".." in path.split("/"):
            raise top.error("host_paths", f"'kubernetes.host_paths': {quote(item)} is not an absolute path "
                            "with an optional ':ro' or ':rw'", hint="e.g. /data:rw")
        out.append(HostPath(path.rstrip("/") or "/", mode == "rw"))
    return tuple(out)
