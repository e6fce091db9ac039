"""Whether a job can run on the cluster, before it is submitted:
``python -m trainwarden.runtime.kubernetes.check JOB.yaml [--kubeconfig PATH]``
(``trainwarden submit --runtime kubernetes`` runs the same check).

The job file's ``kubernetes:`` section, then the cluster: the apiserver
answers, the namespace exists, every verb the runtime uses is allowed
(KubeApi.preflight). The first problem is one sentence naming the field, the
namespace or the permission, with a hint; exit 2. Nothing is created.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from trainwarden.limits import JOB_FILE
from trainwarden.runtime.kubernetes.section import KubernetesSection, parse_section
from trainwarden.yamlsrc import Allowance, ConfigError, LineDict, load_yaml_file

PROG = "trainwarden-kubernetes-check"
REFUSED = 2


def check(job_file: str, kubeconfig: Optional[str] = None, api=None) -> str:
    """"" when the job can run on the cluster; else the one sentence (and hint) saying why not."""
    try:
        section, spot = job_section(job_file), has_spot_roles(job_file)
    except ConfigError as exc:
        return str(exc) + (f" (hint: {exc.hint})" if exc.hint else "")
    from trainwarden.runtime.kubernetes.api import KubeApi, KubeError  # the client: only once the file is good

    try:
        (api or KubeApi.connect(kubeconfig)).preflight(section.namespace, spot=spot)
    except KubeError as exc:
        return str(exc) + (f" (hint: {exc.hint})" if exc.hint else "")
    return ""


def no_job_file() -> str:
    """A job given as a command after --: it has no kubernetes: section to run with."""
    return ("a job for the kubernetes runtime needs a job file with a kubernetes: section (its image at least), "
            "not a command after -- (hint: write JOB.yaml with 'kubernetes: {image: ...}' and submit that)")


def job_section(job_file: str) -> KubernetesSection:
    """The job file's kubernetes: section, checked as loading the whole job
    checks it (jobspec.py calls the same parse_section); the rest of the
    file is the submit's to check."""
    document = load_yaml_file(job_file, Allowance(JOB_FILE))
    if not isinstance(document, LineDict) or "kubernetes" not in document:
        raise ConfigError("the job file has no kubernetes: section; the kubernetes runtime needs at least its "
                          "image", job_file, hint="add 'kubernetes: {image: ...}'")
    return parse_section(document["kubernetes"], job_file, document.line_of("kubernetes"))


def has_spot_roles(job_file: str) -> bool:
    """Whether a role of the job file has a spot section (its release needs one more verb)."""
    document = load_yaml_file(job_file, Allowance(JOB_FILE))
    roles = document.get("roles") if isinstance(document, dict) else None
    return isinstance(roles, dict) and any(isinstance(role, dict) and "spot" in role for role in roles.values())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="can this job run on the Kubernetes cluster?")
    parser.add_argument("job_file")
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    parser.add_argument("--json", action="store_true", help="one JSON object: {ok, error}")
    args = parser.parse_args(argv)
    problem = check(args.job_file, args.kubeconfig)
    if args.json:
        print(json.dumps({"ok": not problem, "error": problem}))
    elif problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
    return REFUSED if problem else 0


if __name__ == "__main__":
    sys.exit(main())
