"""What an instance inherits from its supervisor's environment: never the
broker's credentials, the signing key or the supervisor's own channels."""

import subprocess
import sys

from tests.conftest import ROOT, TRAINWARDEN

SECRETS = {
    "TRAINWARDEN_KAFKA_SASL_PASSWORD": "hunter2-kafka",
    "TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE": "/run/secrets/kafka-password",
    "TRAINWARDEN_KAFKA_SSL_KEYFILE": "/run/secrets/client.key",
    "TRAINWARDEN_SIGNING_KEY": "s" * 40,
    "TRAINWARDEN_SIGNING_KEY_FILE": "/run/secrets/keyring",
    "TRAINWARDEN_C4D_SOCKET": "/run/trainwarden/c4d.sock",
}


def test_a_job_inherits_neither_the_brokers_credentials_nor_the_signing_key(tmp_path, job_id):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "pipeline"), "TRAINWARDEN_STORE": str(tmp_path / "s"),
           "KEPT_FOR_THE_JOB": "yes", **SECRETS}
    probe = ("import os; print('seen', sorted(k for k in os.environ if k.startswith(('TRAINWARDEN_KAFKA', "
             "'TRAINWARDEN_SIGNING', 'TRAINWARDEN_C4D')) ), os.environ.get('KEPT_FOR_THE_JOB'))")
    out = subprocess.run([*TRAINWARDEN, "run", "--job-id", job_id, "--", sys.executable, "-c", probe],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "seen [] yes" in out.stdout, out.stdout
    for value in SECRETS.values():
        assert value not in out.stdout + out.stderr
