"""A service keeps its secrets from the processes beside it (hardening.py):
started with the signing key in its environment, it starts itself again
without it, so that no reader of /proc/PID/environ finds it, and it is not
dumpable, so that a process of its own user can read neither its environment
nor its memory. Real service processes on the in-process bus."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.other_user import DUMPABLE_PROBE, OTHER_UID, other_python, other_writable, python_path
from trainwarden import hardening
from trainwarden.bus import kafka_security
from trainwarden.bus.kafka_security import KafkaSecurity

SECRET = "s" * 20 + "0123456789abcdef"
PASSWORD = "kafka-password-that-must-not-leak"


def _start(argv: list[str], env: dict, log: Path, **user) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, **user)


def _wait_running(proc: subprocess.Popen, log: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "running:" in text:
            return text
        if proc.poll() is not None:
            raise AssertionError(f"the service exited ({proc.returncode}):\n{text}")
        time.sleep(0.05)
    raise AssertionError(f"the service did not start in {timeout_s:.0f} s:\n{log.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _service_env(**extra: str) -> dict:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TRAINWARDEN_")}
    env.update({"PYTHONPATH": str(ROOT / "pipeline"), "TRAINWARDEN_SIGNING_KEY": SECRET,
                "TRAINWARDEN_KAFKA_SASL_PASSWORD": PASSWORD, **extra})
    return env


def test_a_service_given_the_key_in_its_environment_shows_it_in_no_proc_file_and_still_signs(tmp_path):
    log = tmp_path / "processor.log"
    proc = _start([sys.executable, "-m", "trainwarden.cli.main", "processor", "--bootstrap", "memory"],
                  _service_env(), log)
    try:
        started = _wait_running(proc, log)
        # The same process (an execve keeps the pid), with the key it was given.
        assert "messages signed with key id default (1 key id verifies)" in started
        proc_dir = Path(f"/proc/{proc.pid}")
        environ = (proc_dir / "environ").read_bytes()
        assert b"TRAINWARDEN_SIGNING_KEY=" not in environ and SECRET.encode() not in environ
        assert PASSWORD.encode() not in environ and b"TRAINWARDEN_KAFKA_SASL_PASSWORD" not in environ
        assert SECRET.encode() not in (proc_dir / "cmdline").read_bytes()
        # The memory file that carried them across is closed.
        links = [os.readlink(fd) for fd in (proc_dir / "fd").iterdir() if fd.name.isdigit()]
        assert not [link for link in links if "trainwarden-secrets" in link], links
        assert SECRET not in started and PASSWORD not in started
    finally:
        _stop(proc)


def test_a_process_of_the_services_own_user_can_read_neither_its_environ_nor_its_memory(tmp_path):
    """The job that runs as the services' user (no --run-as): it can read a
    dumpable process of that user, and not the service."""
    python = other_python()
    home = other_writable()
    try:
        as_other = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []}
        env = _service_env(PYTHONPATH=python_path(), HOME=str(home))
        log = home / "processor.log"
        service = _start([python, "-m", "trainwarden.cli.main", "processor", "--bootstrap", "memory"], env,
                         log, **as_other)
        bystander = subprocess.Popen([python, "-c", "import time; time.sleep(120)"], env=env, **as_other)
        try:
            _wait_running(service, log)
            probe = home / "probe.py"
            probe.write_text(DUMPABLE_PROBE)

            def probe_of(pid: int) -> list[str]:
                done = subprocess.run([python, str(probe), str(pid)], env=env, capture_output=True, text=True,
                                      timeout=60, **as_other)
                assert done.returncode == 0, done.stderr
                return done.stdout.splitlines()

            assert probe_of(bystander.pid) == ["environ read", "mem read", "fd read"]
            assert probe_of(service.pid) == ["environ refused 13", "mem refused 13", "fd refused 13"]
        finally:
            bystander.kill()
            bystander.wait()
            _stop(service)
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


def test_the_secrets_taken_out_of_the_environment_are_still_the_buses(monkeypatch):
    monkeypatch.setattr(hardening, "_secrets", {"TRAINWARDEN_KAFKA_SASL_PASSWORD": PASSWORD})
    monkeypatch.setattr(kafka_security, "_FLAG_VALUES", {})  # flags an earlier test in this process gave
    for name in ("TRAINWARDEN_KAFKA_SASL_PASSWORD", "TRAINWARDEN_KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINWARDEN_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TRAINWARDEN_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TRAINWARDEN_KAFKA_SASL_USERNAME", "agent")
    assert KafkaSecurity.from_env().password.reveal() == PASSWORD


def test_a_handed_over_descriptor_that_holds_no_secrets_is_refused_in_one_sentence(monkeypatch):
    from trainwarden.yamlsrc import ConfigError

    monkeypatch.setattr(hardening, "make_undumpable", lambda: True)  # not this test process
    handed = os.memfd_create("not-secrets")
    os.write(handed, b'{"PATH": "/bin"}')
    monkeypatch.setenv(hardening.HANDED_OVER, str(handed))
    with pytest.raises(ConfigError, match=r"TRAINWARDEN_HANDED_SECRETS_FD is set to '\d+', but what it holds is not "
                                          r"the secrets trainwarden hands over") as caught:
        hardening.protect(restart=False)
    assert "unset it" in caught.value.hint
    monkeypatch.setenv(hardening.HANDED_OVER, "stdin")
    with pytest.raises(ConfigError, match="it is not a descriptor number"):
        hardening.protect(restart=False)
