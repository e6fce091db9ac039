"""Slurm as a runtime's cluster: a typed client over the Slurm CLI.

``parse`` reads what the CLI prints (pure functions), ``cli`` runs the
commands (allocate, launch steps, cancel, requeue, drain), ``task`` is the
per-task wrapper srun starts, and ``files`` is the agent side that follows the
wrapper's manifests and the tasks' output files. With ``preload``,
``standby_host`` keeps warm interpreters on each node of the allocation
that the wrapper hands its instance to (``handoff`` is their protocol,
``proof`` how an agent knows which incarnation a standby became). Proven
against the real Slurm of ``deploy/slurm/local-slurm``.
"""
