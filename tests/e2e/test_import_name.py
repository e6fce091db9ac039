"""The SDK's import name cannot collide with a training repository's own
``pipeline`` package (common in ML code bases)."""

import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e


def test_the_sdk_imports_as_trainwarden_in_a_job_that_has_its_own_pipeline_package(cli, job_id, tmp_path):
    project = tmp_path / "project"
    (project / "pipeline").mkdir(parents=True)
    (project / "pipeline" / "__init__.py").write_text("OWNER = 'the user'\n")
    script = project / "train.py"
    script.write_text(textwrap.dedent("""
        import pipeline
        from trainwarden.sdk import job_monitor as jm

        print("pipeline belongs to", pipeline.OWNER, flush=True)
        monitor = jm.Monitor(config=jm.PyTorchConfig())
        status = monitor.send_custom_message(content="The training loss of the job is NaN.")
        print("sdk status ok:", status.ok(), flush=True)
        raise SystemExit(0 if status.ok() else 3)
    """))
    # `-S`: an interpreter without Trainwarden installed (the job's own
    # environment), and no PYTHONPATH: the job sees only what Trainwarden
    # gives every job.
    result = cli("run", "--job-id", job_id, "--", sys.executable, "-S", str(script), env={"PYTHONPATH": ""})
    assert result.code == 0, result
    assert "pipeline belongs to the user" in result.out
    assert "sdk status ok: True" in result.out
