"""The environment an instance starts with: torchrun-compatible variables plus
Trainwarden's own, on top of the caller's environment."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Mapping

from trainwarden.events import InstanceSpec, JobSpec, RoleSpec
from trainwarden.settings import JobSettings


# The supervisor's own settings, inherited from its environment: no instance
# needs them, and the C4D channel's location is none of a job's business.
SUPERVISOR_ONLY = frozenset({"TRAINWARDEN_C4D_LOG", "TRAINWARDEN_C4D_SOCKET", "TRAINWARDEN_CONTROL"})
# The supervisor's credentials: a job must never inherit the broker's
# password or the key that signs commands.
SUPERVISOR_SECRET_PREFIXES = ("TRAINWARDEN_KAFKA_SASL_", "TRAINWARDEN_KAFKA_SSL_", "TRAINWARDEN_SIGNING_")


def job_visible(name: str) -> bool:
    return name not in SUPERVISOR_ONLY and not name.startswith(SUPERVISOR_SECRET_PREFIXES)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def instance_env(*, base: Mapping[str, str], job_id: str, spec: InstanceSpec, world_size: int,
                 round_: int, start: int, max_restarts: int, master_addr: str, master_port: int,
                 control_address: str, token: str, sdk_path: str, extra: Mapping[str, str],
                 node: str) -> dict[str, str]:
    env = {name: value for name, value in base.items() if job_visible(name)}
    env.update(extra)
    env.update({
        # torchrun's variables, so unmodified training scripts run as they would under torchrun.
        "RANK": str(spec.rank),
        "LOCAL_RANK": str(spec.rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(spec.index),
        "ROLE_NAME": spec.role,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(round_),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": job_id,
        "TRAINWARDEN_JOB_ID": job_id,
        "TRAINWARDEN_INSTANCE": spec.name,
        "TRAINWARDEN_ROLE": spec.role,
        "TRAINWARDEN_NODE": node,
        "TRAINWARDEN_RESTART_ROUND": str(round_),
        "TRAINWARDEN_INSTANCE_RESTARTS": str(start),
        # Any incarnation after the first (restart, re-queued spot job) is a
        # resume: the job should load its latest checkpoint.
        "TRAINWARDEN_RESUME": "1" if round_ > 0 or start > 0 else "0",
        # The SDK's socket: a request is attributed to the calling process's
        # incarnation by its pid, so this path grants nothing by itself.
        "TRAINWARDEN_SDK_SOCKET": control_address,
        # Marks this incarnation's processes (stack dumps, escaped children); no credential.
        "TRAINWARDEN_TOKEN": token,
        # Without this Python buffers stdout in a pipe and a busy job looks silent.
        "PYTHONUNBUFFERED": "1",
    })
    if sdk_path:
        existing = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = sdk_path + (os.pathsep + existing if existing else "")
    return env


def job_env(spec: JobSpec, role: RoleSpec, settings: JobSettings) -> dict[str, str]:
    """What the job asks for, on every runtime: its own and its role's
    variables, the checkpoint directory, C4D's thresholds."""
    env = dict(spec.env)
    env.update(dict(role.env))
    if spec.checkpoint_dir:
        env["TRAINWARDEN_CHECKPOINT_DIR"] = spec.checkpoint_dir
    if settings.enable_c4d_hang_detection:
        # C4D reads its thresholds from the environment of the processes it watches.
        env.update(settings.c4d_env())
    return env


def sdk_import_dir(run_dir: Path) -> str:
    """A directory holding a copy of the SDK alone (``trainwarden.sdk``: the
    standard library is all it imports), so that any Python the job uses can
    ``import trainwarden.sdk.job_monitor``: in a container image that has no
    Trainwarden, on a node where this package lives elsewhere, and without
    the rest of our site-packages leaking into the job's imports."""
    sdk = Path(__file__).resolve().parent.parent / "sdk"
    target = run_dir / "sdk-path"
    sources = sorted(sdk.glob("*.py"))
    copied = target / "trainwarden" / "sdk"
    if all((copied / source.name).is_file() and (copied / source.name).read_bytes() == source.read_bytes()
           for source in sources):
        return str(target)
    run_dir.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".sdk-path-", dir=run_dir))
    (fresh / "trainwarden" / "sdk").mkdir(parents=True)
    (fresh / "trainwarden" / "__init__.py").write_text("")
    for source in sources:
        shutil.copyfile(source, fresh / "trainwarden" / "sdk" / source.name)
    for directory, _, files in os.walk(fresh):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    old = run_dir / f".sdk-path-old-{os.getpid()}"
    if target.exists() or target.is_symlink():
        os.rename(target, old)  # an older copy (or the link earlier versions made)
    try:
        os.rename(fresh, target)
    except OSError:  # another process put one there meanwhile: the same files
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return str(target)
