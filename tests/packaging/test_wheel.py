"""The wheel as a user gets it: `pip install trainwarden` without extras is
enough for `trainwarden run` and the SDK, and a cluster command without its
client says which extra to install, in one sentence.

Builds the wheel from this tree and installs it into a fresh venv from the
package index, so it needs the network; without it the test skips, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import JOB_PREFIX

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.e2e]
# Job instances must not import the checkout: the installed wheel is under test.
_SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TRAINWARDEN_KAFKA", "TRAINWARDEN_STORE",
             "TRAINWARDEN_CLICKHOUSE_URL")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def _run(*args: object, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_env())


def _index_reachable(python: str, scratch: Path) -> str:
    """'' when pip can fetch from the configured index, else why not."""
    probe = _run(python, "-m", "pip", "download", "--no-deps", "--quiet", "-d", scratch / "probe", "pyyaml",
                 cwd=scratch, timeout=120)
    return "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["pip download failed"])[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel of this tree installed, no extras; its bin directory."""
    work = tmp_path_factory.mktemp("wheel")
    base = shutil.which("python3.11") or sys.executable
    why = _index_reachable(sys.executable, work)
    if why:
        pytest.skip(f"the package index cannot be reached, so the wheel cannot be installed: {why}")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", work / "dist", ROOT, cwd=work)
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = list((work / "dist").glob("trainwarden-*.whl"))
    assert len(wheels) == 1, wheels
    made = _run(base, "-m", "venv", work / "venv", cwd=work, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    bin_dir = work / "venv" / "bin"
    # Without [kafka], [clickhouse] or [all]: what `pip install trainwarden` gives.
    done = _run(bin_dir / "python", "-m", "pip", "install", "--quiet", wheels[0], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir


def test_the_wheel_carries_the_license_the_type_marker_and_the_extras(installed):
    wheel = next(installed.parent.parent.glob("dist/trainwarden-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "trainwarden/py.typed" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert {"Provides-Extra: kafka", "Provides-Extra: clickhouse", "Provides-Extra: all"} <= set(metadata.splitlines())
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    # The cluster's clients only behind an extra.
    for client in ("kafka-python", "clickhouse-connect"):
        assert all("extra ==" in line for line in requires if client in line), requires


def test_without_extras_run_and_the_sdk_work_and_the_cluster_clients_are_absent(installed, tmp_path):
    python = installed / "python"
    absent = _run(python, "-c", "import importlib.util as u; print(u.find_spec('kafka'), u.find_spec('clickhouse_connect'))",
                  cwd=tmp_path)
    assert absent.stdout.strip() == "None None", absent
    # A script run by hand, without an engine: a failed status, never an exception.
    alone = _run(python, "-c", "from trainwarden.sdk import job_monitor as jm; "
                               "st = jm.Monitor(config=jm.PyTorchConfig()).send_custom_message(content='x'); "
                               "print('alone', st.ok())", cwd=tmp_path)
    assert alone.returncode == 0 and alone.stdout.strip() == "alone False", alone
    sdk_call = ("from trainwarden.sdk import job_monitor as jm; "
                "st = jm.Monitor(config=jm.PyTorchConfig()).send_custom_message(content='hello from the wheel'); "
                "print('sdk answered', st.ok())")
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent(f"""\
        job_id: {JOB_PREFIX}wheel
        framework: pytorch
        args: --enable-job-restart=False
        roles:
          worker: {{count: 1, command: [{str(python)!r}, -c, {sdk_call!r}]}}
        """))
    run = _run(installed / "trainwarden", "run", job, "--store", tmp_path / "store", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "sdk answered True" in run.stdout + run.stderr
    history = _run(installed / "trainwarden", "history", "--store", tmp_path / "store", cwd=tmp_path)
    assert history.returncode == 0 and "hello from the wheel" in history.stdout, history


@pytest.mark.parametrize("command, extra", [
    (("kafka", "init", "--bootstrap", "127.0.0.1:9"), "kafka"),
    (("history", "--store", "http://default@127.0.0.1:9/trainwarden"), "clickhouse"),
])
def test_a_cluster_command_without_its_client_names_the_extra_in_one_sentence(installed, tmp_path, command, extra):
    result = _run(installed / "trainwarden", *command, cwd=tmp_path, timeout=120)
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("trainwarden: error: ") and lines[0].endswith("."), lines
    assert lines[0].count(". ") == 0  # one sentence
    assert lines[1] == f"hint: pip install 'trainwarden[{extra}]'", lines
