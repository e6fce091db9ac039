"""The README is part of the interface: its tables are what the commands say,
and it stays short enough to read in ten minutes."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRAINWARDEN
from trainwarden.settings import defaults_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
MOST_LINES = 400


def _table_after(heading: str) -> list[list[str]]:
    """The rows (header first, separator left out) of the first table under a heading."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not re.fullmatch(r"[-:| ]+", line)]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in rows]


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def test_the_readme_flag_table_is_exactly_the_flags_with_their_defaults_and_meanings():
    header, *rows = _table_after("Flags")
    assert header == ["flag", "default", "meaning"]
    assert [(_unquote(f), _unquote(d), m) for f, d, m in rows] == list(defaults_table())


def test_the_readme_runtimes_table_is_what_trainwarden_runtimes_lists():
    listed = json.loads(subprocess.run([*TRAINWARDEN, "runtimes", "-o", "json"], cwd=ROOT, capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    wide = subprocess.run([*TRAINWARDEN, "runtimes", "-o", "wide"], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60).stdout.splitlines()
    columns = re.split(r"\s{2,}", next(line for line in wide if line.startswith("runtime ")).strip())
    header, *rows = _table_after("Where a job runs: the runtimes")
    assert header == columns
    capabilities = columns[3:]
    expected = [[f"`{r['name']}`", r["summary"], f"`{r['command']}`",
                 *("yes" if c.replace(" ", "_") in r["capabilities"] else "-" for c in capabilities)]
                for r in listed]
    assert rows == expected


def test_the_readme_gives_the_two_commands():
    assert "make example" in README and "make test" in README


def test_the_readme_is_read_in_ten_minutes():
    assert len(README.splitlines()) <= MOST_LINES


# ----------------------------------------------------------------- quick starts
#
# Every shell command of the README's quick starts runs here, as written, in
# a bash script (the services in the background, as the README starts them),
# so that the README cannot drift from what works. Only the lines that set up
# a development broker or Slurm cluster are replaced by the ones CI provides
# (each replacement is listed, and must still be in the README).

QUICKSTART = re.compile(r"<!-- quickstart: (\w+) -->\n```sh\n(.*?)\n```", re.S)
BROKER_START = "deploy/kafka/local-kafka start"
BROKER_EXPORT = "export TRAINWARDEN_KAFKA=127.0.0.1:9092"
SLURM_START = 'deploy/slurm/local-slurm install && eval "$(deploy/slurm/local-slurm start)"'


def quickstart(name: str) -> list[str]:
    blocks = dict(QUICKSTART.findall(README))
    assert name in blocks, f"the README has no quick start {name!r} (<!-- quickstart: {name} --> before a sh block)"
    return [line for line in blocks[name].splitlines() if line.strip()]


def _command(line: str) -> str:
    """The line without its trailing comment (two spaces and #), as a shell would run it."""
    return re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()


def _run_quickstart(name: str, tmp_path: Path, replacements: dict[str, str], env: dict[str, str],
                    timeout: float) -> subprocess.CompletedProcess:
    import os
    import shutil
    import sys

    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "trainwarden").exists():
        pytest.skip(f"no trainwarden command beside {sys.executable} (install the package: make setup)")
    lines = [_command(line) for line in quickstart(name)]
    for readme_line in replacements:
        assert readme_line in lines, f"the README's {name} quick start no longer has {readme_line!r}"
    # At the end the services started with & get SIGTERM, as an operator would stop them.
    script = ["set -euo pipefail",
              "trap 'pids=$(jobs -p); if [ -n \"$pids\" ]; then kill $pids 2>/dev/null || true; fi; wait' EXIT"]
    for line in lines:
        script += [f"echo {shlex.quote('+ ' + line)} >&2", replacements.get(line, line)]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # the quick starts name examples/job.yaml
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_") or k in env}
    full_env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", HOME=str(tmp_path),
                    XDG_STATE_HOME=str(tmp_path / "state"), **env)
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-5000:]}"
    return done


def test_the_embedded_quick_start_runs_as_written(tmp_path):
    done = _run_quickstart("embedded", tmp_path, {}, {}, timeout=300)
    assert done.stderr.count("succeeded (all_instances_succeeded)") == 2, done.stderr[-3000:]
    assert (tmp_path / "report.html").exists() and "Jobs" in done.stdout


def _kafka() -> str:
    import os

    bootstrap = os.environ.get("TRAINWARDEN_KAFKA")
    if not bootstrap:
        pytest.skip("no Kafka broker: set TRAINWARDEN_KAFKA=HOST:PORT (deploy/kafka/local-kafka start)")
    return bootstrap


def test_the_kafka_quick_start_runs_as_written(tmp_path):
    import uuid

    bootstrap = _kafka()
    done = _run_quickstart("kafka", tmp_path, {BROKER_START: "true  # the test's broker", BROKER_EXPORT:
                                               f"export TRAINWARDEN_KAFKA={bootstrap}"},
                           {"TRAINWARDEN_KAFKA": bootstrap, "TRAINWARDEN_TOPIC_PREFIX": f"rq{uuid.uuid4().hex[:8]}"},
                           timeout=400)
    assert "succeeded (all_instances_succeeded); 2 job restarts" in done.stderr, done.stderr[-3000:]
    assert "pytorch" in done.stdout.split("Jobs", 1)[-1], done.stdout[-2000:]


def _cluster_quick_start(name: str, tmp_path: Path, start_line: str, start_stub: str, opt_in: str):
    """A cluster quick start on the test's broker and the cluster CI started
    (its README line replaced by ``start_stub``), the job succeeding after
    its two restarts."""
    import uuid

    bootstrap = _kafka()
    done = _run_quickstart(name, tmp_path, {start_line: start_stub, BROKER_START: "true  # the test's broker",
                                            BROKER_EXPORT: f"export TRAINWARDEN_KAFKA={bootstrap}"},
                           {"TRAINWARDEN_KAFKA": bootstrap, opt_in: "1",
                            "TRAINWARDEN_TOPIC_PREFIX": f"rq{uuid.uuid4().hex[:8]}"}, timeout=600)
    assert "succeeded (all_instances_succeeded); 2 job restarts" in done.stderr, done.stderr[-3000:]


def test_the_slurm_quick_start_runs_as_written(tmp_path):
    import os

    if os.environ.get("TRAINWARDEN_SLURM") != "1" or not os.environ.get("SLURM_CONF"):
        pytest.skip("no Slurm cluster: deploy/slurm/local-slurm start, then export the SLURM_CONF it prints and "
                    "TRAINWARDEN_SLURM=1 (.ci/run does)")
    _cluster_quick_start("slurm", tmp_path, SLURM_START, "true  # the test's cluster: $SLURM_CONF",
                         "TRAINWARDEN_SLURM")
    # Through Slurm, not the agents alone: the actuator's plans and the tasks' output are in the --slurm-dir.
    assert any((tmp_path / "tw-slurm").rglob("*")), "nothing in ~/tw-slurm: the job did not run through Slurm"


K8S_START = 'deploy/k8s/local-k8s install && eval "$(deploy/k8s/local-k8s start)"'
K8S_POD_HOSTS = Path("/tmp/tw-pods")  # the README's --k8s-state-dir


def test_the_kubernetes_quick_start_runs_as_written(tmp_path):
    import os
    import shutil

    if os.environ.get("TRAINWARDEN_K8S") != "1" or not os.environ.get("KUBECONFIG"):
        pytest.skip("no Kubernetes cluster: eval \"$(deploy/k8s/local-k8s start)\" and export TRAINWARDEN_K8S=1 "
                    "(.ci/run does)")
    (tmp_path / "deploy" / "k8s").mkdir(parents=True)
    shutil.copy2(ROOT / "deploy" / "k8s" / "local-job-file", tmp_path / "deploy" / "k8s")
    pods_before = set(K8S_POD_HOSTS.iterdir()) if K8S_POD_HOSTS.is_dir() else set()
    _cluster_quick_start("kubernetes", tmp_path, K8S_START, "true  # the test's cluster: $KUBECONFIG",
                         "TRAINWARDEN_K8S")
    # In pods: each pod's host ran the three rounds, in place (a directory per pod, an output file per round).
    pods = set(K8S_POD_HOSTS.iterdir()) - pods_before
    rounds = [sorted(p.name.split("s")[0] for p in pod.glob("r*s*.out")) for pod in pods]
    assert rounds == [["r0", "r1", "r2"]] * 2, rounds
