"""A job: framework, roles with counts and commands, and the arguments string.

From a YAML file (``trainwarden run job.yaml``):

    job_id: mnist-demo            # optional; a unique id is made otherwise
    framework: pytorch            # pytorch, mpi, tensorflow, elasticbatch
    args: --job-execution-mode=Sync --enable-job-restart=True
    workdir: .                    # relative to this file; default: its directory
    env: {DATA_DIR: /data}        # for every instance
    stop_grace_s: 10              # SIGTERM -> SIGKILL when stopping instances
    checkpoint_dir: ckpt/{job_id} # TRAINWARDEN_CHECKPOINT_DIR of every instance
    preload: [torch, numpy]       # imported by a standby interpreter before each (re)start
    roles:
      worker:
        count: 2
        command: [python, train.py]    # or a string, split like a shell would
        env: {...}
        spot: {...}               # a bid for preemptible capacity (pipeline/trainwarden/spot/spec.py)

or from the command line (``trainwarden run --nproc 2 -- python train.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import secrets
import shlex
from pathlib import Path
from typing import Optional

from trainwarden.events import InstanceSpec, JobSpec, RoleSpec
from trainwarden.limits import JOB_FILE, MAX_INSTANCES, QUOTE_CHARS, WHERE, quote
from trainwarden.settings import JobSettings, SettingsError, parse_args_string
from trainwarden.spot.spec import RoleBid, parse_spot
from trainwarden.yamlsrc import Allowance, ConfigError, Fields, load_yaml_file

FRAMEWORKS = ("pytorch", "mpi", "tensorflow", "elasticbatch")
# Rank order: coordinators first, so that RANK 0 is the chief/master when there is one.
ROLE_ORDER = ("chief", "master", "worker", "ps", "evaluator")
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class Role:
    name: str
    count: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class JobDefinition:
    job_id: str
    framework: str
    args: str
    settings: JobSettings
    roles: tuple[Role, ...]
    workdir: Optional[str]
    env: tuple[tuple[str, str], ...]
    stop_grace_s: float
    # Spot roles' bids; empty for a job on ordinary capacity.
    spot: tuple[RoleBid, ...] = ()
    # Given to every instance as TRAINWARDEN_CHECKPOINT_DIR (resume after preemption).
    checkpoint_dir: Optional[str] = None
    # Where the cluster runs it (trainwarden submit --runtime): a runtime of runtime/registry.py.
    runtime: str = "agents"
    # Modules a standby interpreter imports before it becomes an instance (runtime/standby.py).
    preload: tuple[str, ...] = ()
    # The job file's engine section (``kubernetes:``) as JSON, for its runtime's package to check and read.
    runtime_options: str = ""

    def instances(self) -> tuple[InstanceSpec, ...]:
        specs = []
        for role in self.roles:
            for index in range(role.count):
                specs.append(InstanceSpec(name=f"{role.name}-{index}", role=role.name, index=index, rank=len(specs)))
        return tuple(specs)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def spec(self) -> JobSpec:
        """How to start the instances, as every runtime takes it."""
        return JobSpec(roles=tuple(RoleSpec(r.name, r.count, r.command, r.env) for r in self.roles),
                       workdir=self.workdir or "", env=self.env, stop_grace_s=self.stop_grace_s,
                       checkpoint_dir=self.checkpoint_dir or "", runtime=self.runtime, preload=self.preload,
                       framework=self.framework, runtime_options=self.runtime_options)

    def with_preload(self, modules: tuple[str, ...]) -> "JobDefinition":
        """The job with ``modules`` added to its preload list (``--preload``)."""
        merged = self.preload + tuple(m for m in modules if m not in self.preload)
        return dataclasses.replace(self, preload=merged)


def make_job_id(command: tuple[str, ...] = ()) -> str:
    stem = "job"
    for token in command:
        base = Path(token).stem
        if base and not base.startswith("-") and base not in ("python", "python3", "bash", "sh", "env"):
            stem = re.sub(r"[^A-Za-z0-9_-]+", "-", base)[:24].strip("-") or "job"
            break
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stem}-{stamp}-{secrets.token_hex(2)}"


def check_job_id(job_id: str) -> str:
    if not JOB_ID_RE.match(job_id):
        raise ConfigError(f"job id {quote(job_id)} must be 1-128 letters, digits, '_', '.' or '-'",
                          hint="choose another --job-id")
    return job_id


def from_command(command: list[str], nproc: int, args: str, job_id: Optional[str],
                 framework: str = "pytorch", stop_grace_s: float = 10.0) -> JobDefinition:
    if not command:
        raise ConfigError("no command to run", hint="give the command after '--', e.g. trainwarden run -- python train.py")
    if not 1 <= nproc <= MAX_INSTANCES:
        raise ConfigError(f"--nproc must be from 1 to {MAX_INSTANCES}, not {nproc}")
    if framework not in FRAMEWORKS:
        raise ConfigError(f"--framework must be one of {', '.join(FRAMEWORKS)}, not {quote(framework)}")
    settings = parse_args_string(args)
    return JobDefinition(
        job_id=check_job_id(job_id) if job_id else make_job_id(tuple(command)),
        framework=framework, args=args, settings=settings,
        roles=(Role("worker", nproc, tuple(command)),), workdir=None, env=(), stop_grace_s=stop_grace_s,
    )


MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_PRELOAD = 64


def parse_preload(text: str, where: str = "--preload") -> tuple[str, ...]:
    """``torch,numpy`` -> ("torch", "numpy"); a name that is not a module path is refused."""
    modules = tuple(m.strip() for m in text.split(",") if m.strip())
    return check_preload(modules, where)


def check_preload(modules, where: str) -> tuple[str, ...]:
    if len(modules) > MAX_PRELOAD:
        raise ConfigError(f"{where}: at most {MAX_PRELOAD} modules, not {len(modules)}")
    for name in modules:
        if not isinstance(name, str) or not MODULE_RE.match(name):
            raise ConfigError(f"{where}: {quote(name)} is not a module name",
                              hint="give dotted module names, e.g. torch,numpy,transformers")
    return tuple(dict.fromkeys(modules))


def _env(fields: Fields, key: str) -> tuple[tuple[str, str], ...]:
    raw = fields.get(key, dict, {})
    pairs = []
    for name, value in raw.items():
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise fields.error(key, f"environment variable name {quote(name)} is not valid")
        if isinstance(value, (dict, list)) or value is None:
            raise fields.error(key, f"environment variable {name} must have a scalar value")
        pairs.append((name, str(value)))
    return tuple(pairs)


def load_job_file(path: str | Path, job_id: Optional[str] = None) -> JobDefinition:
    path = Path(path)
    top = Fields(load_yaml_file(path, Allowance(JOB_FILE)), path, "a job file",
                 known=("job_id", "framework", "args", "workdir", "env", "stop_grace_s", "roles",
                        "checkpoint_dir", "preload", "kubernetes"))
    framework = top.get("framework", str, "pytorch")
    if framework not in FRAMEWORKS:
        raise top.error("framework", f"'framework' must be one of {', '.join(FRAMEWORKS)}, not {quote(framework)}")
    args = top.get("args", str, "")
    try:
        settings = parse_args_string(args)
    except SettingsError as exc:
        raise top.error("args", f"'args': {exc}", exc.hint) from None
    roles_raw = top.get("roles", dict)
    roles, bids = [], []
    for name in sorted(roles_raw, key=lambda r: ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER)):
        if name not in ROLE_ORDER:
            raise ConfigError(f"unknown role {quote(name)}; roles are {', '.join(ROLE_ORDER)}", path,
                              roles_raw.line_of(name))
        role = Fields(roles_raw[name], path, f"role '{name}'", roles_raw.line_of(name),
                      known=("count", "command", "env", "spot"))
        count = role.get("count", int, 1)
        if not 1 <= count <= MAX_INSTANCES:
            raise role.error("count", f"'count' must be from 1 to {MAX_INSTANCES}")
        if sum(r.count for r in roles) + count > MAX_INSTANCES:
            raise role.error("count", f"the roles come to more than {MAX_INSTANCES} instances; a job may have at "
                                      f"most {MAX_INSTANCES}", hint=f"the limits are listed in {WHERE}")
        command = role.get("command", (list, str))
        command = tuple(shlex.split(command) if isinstance(command, str) else (str(c) for c in command))
        if not command:
            raise role.error("command", "'command' is empty")
        roles.append(Role(name, count, command, _env(role, "env")))
        if "spot" in role.mapping:
            bids.append(parse_spot(role.get("spot", dict), path, name, count, role.line("spot")))
        role.done()
    if not roles:
        raise top.error("roles", "a job needs at least one role")
    workdir = top.get("workdir", str, ".")
    stop_grace = top.get("stop_grace_s", (int, float), 10)
    if not 0 <= stop_grace <= 3600:
        raise top.error("stop_grace_s", "'stop_grace_s' must be from 0 to 3600")
    file_job_id = top.get("job_id", str, None)
    env = _env(top, "env")
    checkpoint_dir = top.get("checkpoint_dir", str, None)
    preload_raw = top.get("preload", (list, str), [])
    try:
        preload = parse_preload(preload_raw, "'preload'") if isinstance(preload_raw, str) else \
            check_preload(tuple(preload_raw), "'preload'")
    except ConfigError as exc:
        raise top.error("preload", str(exc), exc.hint) from None
    runtime_options = _engine_section(top)
    top.done()
    chosen = job_id or file_job_id
    final_id = check_job_id(chosen) if chosen else make_job_id(roles[0].command)
    if checkpoint_dir is not None and not checkpoint_dir.strip():
        raise top.error("checkpoint_dir", "'checkpoint_dir' is empty")
    resolved = (path.parent / workdir).resolve()
    if not resolved.is_dir():
        where = f" ({resolved})" if len(workdir) <= QUOTE_CHARS else ""
        raise ConfigError(f"'workdir' {quote(workdir)} is not a directory{where}", path, top.line("workdir"))
    return JobDefinition(
        job_id=final_id, framework=framework, args=args, settings=settings, roles=tuple(roles),
        workdir=str(resolved), env=env, stop_grace_s=float(stop_grace), spot=tuple(bids),
        checkpoint_dir=str((path.parent / checkpoint_dir.replace("{job_id}", final_id)).resolve())
        if checkpoint_dir else None, preload=preload, runtime_options=runtime_options,
    )


def _engine_section(top: Fields) -> str:
    """The ``kubernetes:`` section as JSON for the spec ("" without one): a
    mapping here; its runtime's package checks it strictly (at submit, and
    again where the runtime is built), so this module imports no engine."""
    if "kubernetes" not in top.mapping:
        return ""
    return json.dumps({"kubernetes": top.get("kubernetes", dict)}, sort_keys=True, default=str)
