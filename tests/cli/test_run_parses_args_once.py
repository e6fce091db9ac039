"""``trainwarden run`` parses the job's arguments string once, where the job
is defined (jobspec.py); the run, its engine and its runtime take the
``JobSettings`` of that parse."""

from __future__ import annotations

import sys

import trainwarden.engine.core as engine_core
import trainwarden.jobspec as jobspec
import trainwarden.settings as settings
from trainwarden.cli.main import main


def test_a_run_parses_its_arguments_string_once(monkeypatch, tmp_path, job_id):
    parsed: list[str] = []
    real = settings.parse_args_string

    def counting(text: str):
        parsed.append(text)
        return real(text)

    for module in (settings, jobspec, engine_core):
        monkeypatch.setattr(module, "parse_args_string", counting)
    args = "--enable-job-restart=True --max-num-of-job-restart=2"
    code = main(["run", "--store", str(tmp_path / "store"), "--job-id", job_id, "--args", args, "--",
                 sys.executable, "-c", "print('done')"])
    assert code == 0
    assert parsed == [args]
