"""A thin, typed client over the Slurm CLI (sbatch, srun, scancel, scontrol).

Every call is one ``subprocess.run`` with a timeout, the environment carrying
``SLURM_CONF``; a failure raises SlurmError (one sentence naming the command,
with a hint, and the command's stderr). Only :meth:`SlurmCli.launch_step`
starts a process that outlives the call: srun, detached in its own session.

Facts of Slurm 22.05 this relies on (proven in tests/slurm/test_real_slurm.py):

- The holder batch step of :meth:`allocate` takes no CPU (``CPUs=0``), so
  steps launched into the allocation get the cores without ``--overlap``.
- A step launched while another holds the cores waits for them (srun prints
  "Job step creation temporarily disabled, retrying"): a restart's new step
  starts once the old step is gone, never beside it. After a cancel the cores
  are free again at once (a new step starts within ~0.2 s).
- A step launched with ``--overlap`` shares the cores with every other step,
  even those launched without it: the standby hosts' step (one task per
  node, for the job's whole allocation) never delays a round's step.
- ``scancel JOB.STEP`` without a signal SIGKILLs the step's processes at
  once; ``signal="TERM"`` lets the task wrapper forward it to the command.
- ``sbatch --uid=U --gid=G`` (root only) makes the allocation user U's;
  a step root launches into it with ``srun --jobid`` still runs as root
  unless srun is given the same ``--uid``/``--gid``: both carry them.
- ``scontrol requeue`` holds the job (Reason=BeginTime) for ~120 s; an
  update of ``StartTime=now`` sent while the job is still COMPLETING is
  overwritten, so :meth:`requeue_now` waits for PENDING before sending it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, TypeVar

from trainwarden.runtime.run_as import RunAs
from trainwarden.runtime.slurm.parse import (
    JobState,
    SlurmJob,
    SlurmNode,
    SlurmStep,
    StepId,
    compress_hostlist,
    parse_jobs,
    parse_nodes,
    parse_steps,
)

T = TypeVar("T")

INSTALL_HINT = "apt-get install -y slurm-wlm slurmctld slurmd slurm-client munge"
HOLDER_SCRIPT = "exec sleep infinity"
# The per-task output file of a step; task.py and files.py name it the same way.
STEP_OUTPUT = "%j-step%s-task%t.out"
# A requeue revokes the job's credential on its nodes; a slurmd refuses a
# new credential of the same job created within the same second ("Job
# credential revoked": the batch step is killed and the job ends). Slurm's
# own ~120 s hold avoids it; a requeue that starts at once waits this long.
REVOKE_SETTLE_S = 2.0


class SlurmError(RuntimeError):
    """A Slurm command failed; ``str()`` is one sentence with a hint."""

    def __init__(self, message: str, *, command: Sequence[str] = (), returncode: Optional[int] = None, stderr: str = ""):
        super().__init__(message)
        self.command = tuple(command)
        self.returncode = returncode
        self.stderr = stderr


class SlurmTimeout(SlurmError):
    """:meth:`SlurmCli.wait_for` gave up."""


def _hint(stderr: str) -> str:
    text = stderr.lower()
    if "unable to contact slurm controller" in text or "connection refused" in text or "zero bytes" in text:
        return "is slurmctld running? start it with deploy/slurm/local-slurm start and export the SLURM_CONF it prints"
    if "munge" in text or "authentication" in text:
        return "munged does not answer or its key differs: check AuthInfo in SLURM_CONF and the munged log"
    if "invalid job id" in text:
        return "the job has ended and Slurm forgot it, or it never existed"
    if "requested node configuration is not available" in text or "invalid node name" in text:
        return "ask for fewer nodes or exclude fewer (see sinfo -N)"
    return "see the command's stderr (SlurmError.stderr)"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


class SlurmCli:
    """The Slurm commands a runtime needs, typed.

    conf: the slurm.conf to use (default: ``$SLURM_CONF``, else Slurm's own
    default). timeout_s: the limit of each command. run_as: the user (and
    group) the allocations and their steps run as (``--uid``/``--gid``,
    which Slurm grants root only); None: the caller's own.
    """

    def __init__(self, conf: "str | Path | None" = None, *, timeout_s: float = 30.0, run_as: Optional[RunAs] = None):
        conf = conf if conf is not None else os.environ.get("SLURM_CONF")
        self.conf: Optional[str] = str(conf) if conf else None
        self.timeout_s = timeout_s
        self.run_as = run_as

    def _user_args(self) -> list[str]:
        return [f"--uid={self.run_as.uid}", f"--gid={self.run_as.gid}"] if self.run_as else []

    # ------------------------------------------------------------ plumbing

    def environment(self, extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        """os.environ without the SLURM_* of an enclosing job, plus SLURM_CONF and extra."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        if extra:
            env.update(extra)
        return env

    def run(self, args: Sequence[str], *, timeout_s: Optional[float] = None, input: Optional[str] = None) -> str:
        """Runs one command, returns its stdout; raises SlurmError when it fails."""
        argv = [str(a) for a in args]
        shown = shlex.join(argv)
        if len(shown) > 160:
            shown = shown[:157] + "..."
        try:
            proc = subprocess.run(
                argv,
                input=input,
                capture_output=True,
                text=True,
                env=self.environment(),
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except FileNotFoundError as e:
            raise SlurmError(
                f"`{shown}` could not run because {argv[0]} is not installed; install Slurm with `{INSTALL_HINT}`.",
                command=argv,
            ) from e
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise SlurmError(
                f"`{shown}` did not answer within {e.timeout:g}s; is slurmctld overloaded or down (sinfo, the slurmctld log)?",
                command=argv,
                stderr=stderr,
            ) from e
        if proc.returncode != 0:
            raise SlurmError(
                f"`{shown}` failed with exit {proc.returncode} ({_first_line(proc.stderr) or 'no stderr'}); {_hint(proc.stderr)}.",
                command=argv,
                returncode=proc.returncode,
                stderr=proc.stderr,
            )
        return proc.stdout

    def wait_for(
        self, predicate: Callable[[], Optional[T]], timeout_s: float, *, interval_s: float = 0.1, what: str = "the condition"
    ) -> T:
        """Polls predicate until it returns something truthy, which it returns; SlurmTimeout after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise SlurmTimeout(f"{what} did not happen within {timeout_s:g}s; check squeue, sinfo -N and the Slurm logs.")
            time.sleep(interval_s)

    # ------------------------------------------------------------ jobs

    def allocate(
        self,
        name: str,
        nodes: int,
        *,
        exclude: Sequence[str] = (),
        output_dir: Path,
        requeue: bool = True,
        extra_args: Sequence[str] = (),
    ) -> int:
        """Submits a holder batch job of ``nodes`` nodes (one task each) that keeps the allocation; returns its id."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "sbatch",
            "--parsable",
            "--requeue" if requeue else "--no-requeue",
            "--open-mode=append",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--job-name={name}",
            f"--chdir={output_dir}",
            f"--output={output_dir / '%j-holder.out'}",
            *self._user_args(),
        ]
        if exclude:
            args.append(f"--exclude={compress_hostlist(list(exclude))}")
        args.extend(extra_args)
        args.append(f"--wrap={HOLDER_SCRIPT}")
        out = self.run(args).strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"`sbatch` printed {out!r} instead of a job id; is this Slurm's sbatch?", command=args)
        return int(job_id)

    def launch_step(
        self,
        job_id: int,
        tasks: int,
        command: Sequence[str],
        *,
        output_dir: Path,
        env: Optional[Mapping[str, str]] = None,
        exclude: Sequence[str] = (),
        name: Optional[str] = None,
        signal_grace: Optional[str] = None,
        srun_log: Optional[Path] = None,
        overlap: bool = False,
        nodelist: Sequence[str] = (),
    ) -> "subprocess.Popen[bytes]":
        """Starts ``command`` as a step of ``tasks`` tasks, one per node, in allocation ``job_id``.

        Each task's stdout and stderr go to ``output_dir/<job>-step<step>-task<task>.out``
        (append mode). srun runs detached (own session, stdin /dev/null), so
        the caller's exit does not end the step; srun's own messages go to
        srun_log (default ``output_dir/<job>-srun.log``, appended).
        signal_grace, e.g. ``"TERM@30"``: srun's ``--signal`` (sent that many
        seconds before the time limit). overlap: share the cores with the
        other steps (``--overlap``) instead of waiting for them. nodelist:
        the nodes the step must run on (``--nodelist``).
        """
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        out = output_dir / STEP_OUTPUT
        args = [
            "srun",
            f"--jobid={job_id}",
            f"--nodes={tasks}",
            f"--ntasks={tasks}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=0",
            "--open-mode=append",
            f"--output={out}",  # stderr too: one fd for both, in the order written
            "--input=none",
            "--quiet",
            *self._user_args(),
        ]
        if exclude:
            args.append(f"--exclude={compress_hostlist(list(exclude))}")
        if nodelist:
            args.append(f"--nodelist={compress_hostlist(list(nodelist))}")
        if name:
            args.append(f"--job-name={name}")
        if signal_grace:
            args.append(f"--signal={signal_grace}")
        if overlap:
            args.append("--overlap")
        args.extend(str(c) for c in command)
        log_path = Path(srun_log) if srun_log is not None else output_dir / f"{job_id}-srun.log"
        with open(log_path, "ab") as log:
            try:
                return subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=self.environment(env),
                    start_new_session=True,
                    cwd=output_dir,
                )
            except FileNotFoundError as e:
                raise SlurmError(
                    f"`srun` could not run because it is not installed; install Slurm with `{INSTALL_HINT}`.",
                    command=args,
                ) from e

    def cancel_step(self, job_id: int, step_id: StepId, *, signal: Optional[str] = None) -> None:
        """scancel JOB.STEP: without signal Slurm SIGKILLs the step at once; signal="TERM" asks it to stop."""
        args = ["scancel", "--quiet"]
        if signal:
            args.append(f"--signal={signal}")
        self.run([*args, f"{job_id}.{step_id}"])

    def cancel_steps(self, job_id: int, *, signal: Optional[str] = None) -> list[StepId]:
        """Cancels every step srun launched into the job (not batch/extern); returns their ids."""
        ids = [s.step_id for s in self.steps(job_id) if not s.special and not s.state.finished]
        if ids:
            args = ["scancel", "--quiet"]
            if signal:
                args.append(f"--signal={signal}")
            self.run([*args, *(f"{job_id}.{i}" for i in ids)])
        return ids

    def cancel(self, job_id: int, *, signal: Optional[str] = None) -> None:
        """scancel JOB (the whole allocation); a job Slurm no longer knows is not an error."""
        args = ["scancel", "--quiet"]
        if signal:
            args += [f"--signal={signal}", "--full"]
        try:
            self.run([*args, str(job_id)])
        except SlurmError as e:
            if "invalid job id" not in e.stderr.lower():
                raise

    def requeue_now(self, job_id: int, *, exclude: Sequence[str] = (), timeout_s: float = 30.0) -> SlurmJob:
        """Requeues the job and lets it start again at once (not after Slurm's ~120 s hold).

        exclude: nodes the job must not get again (ExcNodeList, set while it
        is pending). Returns the job as it is once the update was accepted.
        """
        requeued_at = time.monotonic()
        self.run(["scontrol", "requeue", str(job_id)])

        def pending() -> Optional[SlurmJob]:
            job = self.job(job_id)
            if job is None:
                raise SlurmError(f"job {job_id} vanished while being requeued; was it cancelled?")
            return job if job.state in (JobState.PENDING, JobState.REQUEUED) else None

        # A StartTime sent while the job is still COMPLETING is overwritten by the requeue's hold.
        self.wait_for(pending, timeout_s, interval_s=0.05, what=f"the requeued job {job_id} becoming PENDING")
        settle = REVOKE_SETTLE_S - (time.monotonic() - requeued_at)
        if settle > 0:
            time.sleep(settle)
        update = ["scontrol", "update", f"jobid={job_id}"]
        if exclude:
            update.append(f"ExcNodeList={compress_hostlist(list(exclude))}")
        update.append("StartTime=now")
        self.run(update)
        job = self.job(job_id)
        if job is None:
            raise SlurmError(f"job {job_id} vanished right after its requeue; was it cancelled?")
        return job

    def exclude(self, job_id: int, nodes: Sequence[str]) -> None:
        """The nodes a pending job must not get (its ExcNodeList), exactly these: none clears it."""
        self.run(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={compress_hostlist(list(nodes))}"])

    # ------------------------------------------------------------ reading

    def _show(self, kind: str, ident: str) -> str:
        """``scontrol show KIND -o IDENT``; "" when Slurm does not know it."""
        try:
            return self.run(["scontrol", "show", kind, "-o", ident])
        except SlurmError as e:
            low = e.stderr.lower()
            if "invalid job id" in low or "not found" in low or "invalid node name" in low:
                return ""
            raise

    def job(self, job_id: int) -> Optional[SlurmJob]:
        """The job, or None when Slurm no longer knows it (MinJobAge after it ended)."""
        jobs = [j for j in parse_jobs(self._show("job", str(job_id))) if j.job_id == job_id]
        return jobs[0] if jobs else None

    def jobs(self, *, name: Optional[str] = None) -> list[SlurmJob]:
        """Every job Slurm knows (optionally only those called ``name``)."""
        out = self.run(["scontrol", "show", "job", "-o"])
        jobs = [] if "no jobs in the system" in out.lower() else parse_jobs(out)
        return [j for j in jobs if name is None or j.name == name]

    def steps(self, job_id: int) -> list[SlurmStep]:
        """The job's live steps (including batch/extern; see SlurmStep.special)."""
        return [s for s in parse_steps(self._show("step", str(job_id))) if s.job_id == job_id]

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self.run(["scontrol", "show", "node", "-o"]))

    def node(self, name: str) -> Optional[SlurmNode]:
        found = [n for n in parse_nodes(self._show("node", name)) if n.name == name]
        return found[0] if found else None

    # ------------------------------------------------------------ nodes

    def drain(self, node: str, reason: str) -> None:
        """Keeps new jobs off the node; running ones stay. reason may hold spaces."""
        if not reason.strip():
            raise ValueError("Slurm needs a reason to drain a node")
        self.run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume(self, node: str) -> None:
        self.run(["scontrol", "update", f"nodename={node}", "state=resume"])
