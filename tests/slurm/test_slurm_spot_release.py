"""A spot job's release on the ``slurm`` runtime, without Slurm (its
stand-in from test_slurm_lone_restart.py), on a pinned clock: SIGTERM
through the agents with the pool's notice as their grace, the allocation
cancelled only once the notice is over, a round started meanwhile launched
in a new allocation after it, and a cancel Slurm refuses tried again.
tests/slurm/test_slurm_spot.py does it on the real cluster."""

from __future__ import annotations

import sys

from tests.slurm.test_slurm_lone_restart import NODES, _Port, _Slurm
from trainwarden.bus.messages import StopInstances
from trainwarden.jobspec import from_command
from trainwarden.runtime.base import Capability, EngineError
from trainwarden.runtime.slurm.cli import SlurmError
from trainwarden.runtime.slurm.runtime import SlurmSite

ARGS = "--enable-job-restart=True"


class _Market(_Slurm):
    """Each allocation a new id; cancels recorded, or refused while ``refuse`` says so."""

    def __init__(self):
        super().__init__()
        self.allocated: list[int] = []
        self.cancelled: list[int] = []
        self.refuse = False

    def allocate(self, name, nodes, *, exclude=(), output_dir):
        self.allocated.append(7 + len(self.allocated))
        return self.allocated[-1]

    def cancel(self, job_id, *, signal=None):
        if self.refuse:
            raise SlurmError("scancel: error: Socket timed out on send/recv operation")
        self.cancelled.append(job_id)


def _running(tmp_path):
    definition = from_command([sys.executable, "train.py"], 2, ARGS, "spot", stop_grace_s=5)
    slurm, port = _Market(), _Port()
    runtime = port.runtime(definition, ARGS, SlurmSite(slurm, tmp_path))
    for _ in range(3):
        port.turn(runtime)
    assert slurm.allocated == []  # queued: nothing asked of Slurm until the engine starts it
    for name in runtime.instance_names:
        runtime.start(name, 0, 0)
    port.turn(runtime)
    for name, node in zip(runtime.instance_names, NODES):
        runtime.heard(name, 0, 0, node)
    port.take(runtime.drain())
    port.commands.clear()
    return runtime, slurm, port


def test_a_released_spot_job_gets_sigterm_with_the_notice_and_its_allocation_is_cancelled_after_it(tmp_path):
    runtime, slurm, port = _running(tmp_path)
    assert Capability.PREEMPT in runtime.capabilities and slurm.allocated == [7] and len(slurm.steps) == 1
    runtime.preempt(3.0)
    port.take(runtime.drain())
    stops = [c for c in port.commands if isinstance(c, StopInstances)]
    assert sorted((s.node, s.instances, s.grace_s) for s in stops) == [
        ("n1", ("worker-0",), 3.0), ("n2", ("worker-1",), 3.0)]  # the notice, not the job's stop grace
    port.now += 2.9
    port.turn(runtime)
    assert slurm.cancelled == [] and not slurm.steps[0]["proc"].killed  # the notice: the tasks checkpoint
    port.now += 0.1
    port.turn(runtime)
    assert slurm.cancelled == [7] and slurm.steps[0]["proc"].killed  # released
    assert runtime.allocation is None


def test_a_round_started_within_the_notice_waits_for_the_release_and_runs_in_a_new_allocation(tmp_path):
    runtime, slurm, port = _running(tmp_path)
    runtime.preempt(2.0)
    for name in runtime.instance_names:
        runtime.start(name, 1, 0)  # the market allowed it again within the notice
    port.now += 1
    port.turn(runtime)
    assert len(slurm.steps) == 1 and slurm.allocated == [7]  # never a step in the allocation being released
    port.now += 1
    port.turn(runtime)  # released, and the next one asked for
    assert slurm.cancelled == [7] and slurm.allocated == [7, 8]
    port.turn(runtime)
    [_, resumed] = slurm.steps
    assert resumed["job"] == 8
    assert {i["env"]["TRAINWARDEN_RESUME"] for i in resumed["plan"]["instances"]} == {"1"}


def test_a_release_slurm_refuses_is_tried_again_and_nothing_starts_before_it(tmp_path):
    runtime, slurm, port = _running(tmp_path)
    slurm.refuse = True
    runtime.preempt(0.0)  # no notice: released at once, or as soon as Slurm answers
    for name in runtime.instance_names:
        runtime.start(name, 1, 0)
    events = runtime.drain()
    assert [e for e in events if isinstance(e, EngineError)], events  # said, and counted
    assert runtime.errors == 1 and slurm.allocated == [7]
    slurm.refuse = False
    port.turn(runtime)
    assert slurm.cancelled == [7] and slurm.allocated == [7, 8]
