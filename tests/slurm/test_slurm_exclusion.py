"""The nodes a waiting allocation of the ``slurm`` runtime excludes follow
what is to be avoided now, without Slurm (its stand-in from
test_slurm_lone_restart.py). Seen on the local cluster: an allocation
requeued away from an isolated node while another of its nodes was
"not responding" for a moment (Slurm says so of a node it has just resumed,
until its next ping) excluded both; with two of three nodes excluded it was
"never runnable" and the job never ended."""

from __future__ import annotations

import sys

from tests.slurm.test_slurm_lone_restart import NODES, _Port, _Slurm
from trainwarden.jobspec import from_command
from trainwarden.runtime.slurm.parse import JobState, NodeState, SlurmJob, SlurmNode
from trainwarden.runtime.slurm.runtime import SlurmSite


class _Waiting(_Slurm):
    """An allocation requeued with n1 (isolated) and n2 (not responding then) excluded, pending."""

    def __init__(self):
        super().__init__()
        self.excluded = ("n1", "n2")
        self.updates: list[tuple[int, list]] = []
        self.responding = {"n1": True, "n2": True, "n3": True}

    def job(self, job_id):
        return SlurmJob(job_id, "tw", JobState.PENDING, (), 1, "BadConstraints", self.excluded, None)

    def exclude(self, job_id, nodes):
        self.updates.append((job_id, list(nodes)))
        self.excluded = tuple(nodes)

    def nodes(self):
        return [SlurmNode(name, NodeState.IDLE, False, not self.responding[name], "") for name in NODES]


def _runtime(tmp_path, slurm):
    definition = from_command([sys.executable, "train.py"], 2, "--enable-job-restart=True", "held", stop_grace_s=2)
    port = _Port()
    runtime = port.runtime(definition, "--enable-job-restart=True", SlurmSite(slurm, tmp_path))
    runtime.excluded.add("n1")  # isolated by a rule
    return runtime, port


def test_a_waiting_allocation_no_longer_excludes_a_node_that_answers_again(tmp_path):
    slurm = _Waiting()
    runtime, port = _runtime(tmp_path, slurm)
    for name in runtime.instance_names:
        runtime.start(name, 1, 1)  # the allocation is asked for (the stand-in's id 7)
    port.turn(runtime)  # Slurm's nodes read: all respond
    assert slurm.updates == [(7, ["n1"])] and slurm.excluded == ("n1",)
    port.now += 1
    port.turn(runtime)
    assert slurm.updates == [(7, ["n1"])]  # said once


def test_a_waiting_allocation_excludes_a_node_found_down_meanwhile(tmp_path):
    slurm = _Waiting()
    slurm.excluded = ("n1",)
    slurm.responding["n3"] = False
    runtime, port = _runtime(tmp_path, slurm)
    for name in runtime.instance_names:
        runtime.start(name, 1, 1)
    port.turn(runtime)
    assert slurm.updates == [(7, ["n1", "n3"])]
