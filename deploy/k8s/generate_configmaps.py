#!/usr/bin/env python3
"""Write the two generated ConfigMaps of deploy/k8s from their sources.

    rules-configmap.yaml   <- rules/*.yaml          (ConfigMap trainwarden-rules)
    vector-configmap.yaml  <- deploy/vector/vector.yaml (ConfigMap trainwarden-vector)

Usage: python3 deploy/k8s/generate_configmaps.py [--check]

--check writes nothing and exits 1 when a checked-in file is out of date
(tests/deploy runs the same comparison). Needs PyYAML. The same ConfigMaps,
formatted differently, come from
    kubectl create configmap trainwarden-rules -n trainwarden --from-file=rules/ --dry-run=client -o yaml
    kubectl create configmap trainwarden-vector -n trainwarden --from-file=deploy/vector/vector.yaml --dry-run=client -o yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NAMESPACE = "trainwarden"


class _Literal(str):
    """A string dumped as a YAML literal block (|), readable in a diff."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def _configmap(name: str, component: str, files: dict[str, str], source: str) -> str:
    document = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "trainwarden", "app.kubernetes.io/component": component},
        },
        "data": {key: _Literal(text) for key, text in files.items()},
    }
    header = (f"# GENERATED from {source} by deploy/k8s/generate_configmaps.py; do not edit.\n"
              f"# Regenerate after changing {source}: python3 deploy/k8s/generate_configmaps.py\n")
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def rule_files(rules_dir: Path = ROOT / "rules") -> dict[str, str]:
    """What --from-file=rules/ takes: the regular files of the directory (not rules/tests/)."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(rules_dir.iterdir())
            if p.is_file() and p.suffix in (".yaml", ".yml")}


def render() -> dict[Path, str]:
    vector = ROOT / "deploy" / "vector" / "vector.yaml"
    return {
        HERE / "rules-configmap.yaml": _configmap("trainwarden-rules", "processor", rule_files(), "rules/*.yaml"),
        HERE / "vector-configmap.yaml": _configmap("trainwarden-vector", "vector",
                                                   {"vector.yaml": vector.read_text(encoding="utf-8")},
                                                   "deploy/vector/vector.yaml"),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in render().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if check:
            stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python3 deploy/k8s/generate_configmaps.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
