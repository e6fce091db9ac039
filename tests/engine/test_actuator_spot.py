"""The actuator on spot decisions: release, restart from the queue, lifecycle rows, at most once."""

from __future__ import annotations

from trainwarden.actuator import Actuator
from trainwarden.runtime.base import Capability
from trainwarden.store.records import FaultRecord, SpotTransition
from tests.engine.test_spot import SpotJob, offer


class FakeRuntime:
    instance_names = ["worker-0", "worker-1"]
    capabilities = frozenset({Capability.RESTART_JOB, Capability.PREEMPT})

    def __init__(self):
        self.calls = []

    def start(self, name, round_, start):
        self.calls.append(("start", name, round_, start))
        return 1

    def stop(self, names, snapshot="", incarnations=None):
        self.calls.append(("stop", tuple(names)))

    def stop_all(self, snapshot=""):
        self.calls.append(("stop_all",))

    def preempt(self, notice_s):
        self.calls.append(("preempt", notice_s))


class Recorder:
    def __init__(self):
        self.records = []

    def write(self, records):
        self.records.extend(records)


def drive(job: SpotJob):
    runtime, history = FakeRuntime(), Recorder()
    actuator = Actuator(runtime, history, "node-a", clock=lambda: job.now)
    for decision in job.decisions:
        actuator.execute(decision)
        actuator.execute(decision)  # a redelivered decision is not acted on twice
    return runtime, history, actuator


def test_a_preemption_releases_the_instances_and_the_resume_starts_the_new_round():
    job = SpotJob()
    job.at(0).market(offer(0.3))
    job.at(10).market(offer(0.9, notice=3))
    job.at(20).market(offer(0.3))
    runtime, history, actuator = drive(job)
    assert runtime.calls == [("start", "worker-0", 0, 0), ("start", "worker-1", 0, 0), ("preempt", 3.0),
                             ("start", "worker-0", 1, 1), ("start", "worker-1", 1, 1)]
    assert actuator.duplicates == 4
    faults = [r for r in history.records if isinstance(r, FaultRecord)]
    assert [(r.error_source, r.action, r.result, r.reason) for r in faults] == [
        ("preemption", "requeue", "pending", "preempted"), ("preemption", "requeue", "done", "preempted")]
    steps = [r for r in history.records if isinstance(r, SpotTransition)]
    assert [(s.state, s.round, s.preemptions) for s in steps] == [
        ("queued", 0, 0), ("running", 0, 0), ("requeued", 0, 1), ("running", 1, 1)]
    assert steps[2].paid > 0 and steps[2].on_demand > steps[2].paid
