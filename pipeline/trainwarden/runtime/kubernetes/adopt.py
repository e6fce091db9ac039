"""The node agent's side of the ``kubernetes`` runtime: the starts the
actuator sends for this node's pods (a ``StartInstance`` whose job variables
name the pod, ``TRAINWARDEN_POD_UID``) are claimed by this adopter instead
of being started by the agent (runtime/adoption.py). The node host issues
the incarnation's token and builds its environment as for its own
instances; this adopter hands the run to the pod's host (node_side.PodHosts)
once it listens, adopts the process the pod host started (by its cgroup,
namespace pid and token), and gives the node host its start, lines and
exit. A stop goes to the pod's host (SIGTERM, grace, SIGKILL inside the
pod) and returns once the incarnation's exit is written.

``trainwarden agent --k8s-state-dir DIR`` on each Kubernetes node, with the
node's Kubernetes name as ``--node`` and the host's PID namespace (the
DaemonSet's ``hostPID``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Mapping, Sequence

from trainwarden.clock import now as clock_now
from trainwarden.events import InstanceExited, InstanceStarted, LogLine, Stream
from trainwarden.runtime.adoption import Adopted, AdopterFactory, Launch, Stopped
from trainwarden.runtime.control import Incarnation
from trainwarden.runtime.kubernetes.node_side import POD_UID_VARIABLE, PodHostError, PodHosts
from trainwarden.runtime.kubernetes.pod_host import incarnation_stem

# A claimed start waits this long for its pod's host to listen (the pod was
# just created: image, container, interpreter); then it could not start.
POD_HOST_WAIT_S = 120.0
CANNOT_START = 127
# After a stop's grace, how long the pod host has to write the exit (it
# SIGKILLs at the grace): past that the incarnation is taken as gone.
EXIT_WRITTEN_S = 5.0
POLL_S = 0.05
HANDED_AT_ONCE = 8  # pod hosts asked to start an incarnation at the same time, per node


def adopter(state_dir: Path, node: str, clock: Callable[[], float] = clock_now) -> AdopterFactory:
    """The pods of this node, for its agent's node host (``agent --k8s-state-dir``)."""
    return lambda control_address: PodAdopter(PodHosts(Path(state_dir), node, clock,
                                                       control_address=control_address))


class PodAdopter:
    def __init__(self, hosts: PodHosts):
        self.hosts = hosts
        self._lock = threading.Lock()  # stops run in the node host's stopper threads
        self._waiting: dict[tuple[str, str], tuple[float, Launch]] = {}  # (job, instance) -> since, the start
        self._pods: dict[Incarnation, str] = {}  # handed to a pod host -> the pod's uid
        # A pod host may take its time to answer (ANSWER_S): the agent's loop
        # never waits on one; the pods of a round are handed theirs together.
        self._handing = ThreadPoolExecutor(max_workers=HANDED_AT_ONCE, thread_name_prefix="pod-run")
        self._in_flight: dict[Incarnation, Future] = {}  # asked of a pod host, not answered yet
        self._handed: list[tuple[Launch, str, object]] = []  # answered: the launch, the uid, Followed or PodHostError
        self._said: list = []  # events of this adopter's own making (a start that failed, a stop of one unstarted)
        self.failed = 0  # starts no pod host took

    def expect(self, job_id: str, incarnations) -> None:
        pass  # what it adopts it launched itself, with the node host's own tokens: nothing to announce

    def claims(self, asked: Mapping[str, str]) -> bool:
        return bool(asked.get(POD_UID_VARIABLE))

    def launch(self, launch: Launch) -> None:
        inc = launch.incarnation
        with self._lock:
            # A newer start of the instance replaces one still waiting (the node host starts newer ones only).
            self._waiting[(inc.job_id, inc.instance)] = (self.hosts.clock(), launch)

    def poll(self) -> list:
        out: list = []
        now = self.hosts.clock()
        with self._lock:
            waiting = list(self._waiting.items())
        for key, (since, launch) in waiting:
            uid = launch.env[POD_UID_VARIABLE]
            if not self.hosts.ready(uid):
                if now - since > POD_HOST_WAIT_S:
                    self._drop_waiting(key, launch)
                    self._cannot_start(launch, f"the host of pod {uid} did not listen within "
                                               f"{POD_HOST_WAIT_S:.0f} s", out)
                continue
            if not self._drop_waiting(key, launch):
                continue  # stopped meanwhile
            with self._lock:
                self._in_flight[launch.incarnation] = self._handing.submit(self._hand, launch, uid)
        with self._lock:
            handed, self._handed = self._handed, []
            said, self._said = self._said, []
        for launch, uid, answer in handed:
            out.extend(self._adopted(launch, uid, answer))
        out.extend(said)
        for event in self.hosts.poll():
            if isinstance(event, InstanceExited):
                with self._lock:
                    self._pods.pop(Incarnation(event.job_id, event.instance, event.round, event.start), None)
            out.append(event)
        return out

    def _drop_waiting(self, key: tuple[str, str], launch: Launch) -> bool:
        with self._lock:
            if self._waiting.get(key, (0, None))[1] is not launch:
                return False
            del self._waiting[key]
            return True

    def _hand(self, launch: Launch, uid: str) -> None:
        """In a thread of its own: the pod's host starts the incarnation."""
        inc = launch.incarnation
        try:
            answer: object = self.hosts.hand(uid, inc.job_id, inc.instance, inc.round, inc.start,
                                             list(launch.command), dict(launch.env), launch.workdir)
        except PodHostError as exc:
            answer = exc
        except Exception as exc:  # whatever else went wrong: the start fails, said, and nothing waits on it
            answer = PodHostError(f"handing the incarnation to pod {uid}'s host failed: {exc!r}"[:300])
        with self._lock:
            if not isinstance(answer, PodHostError):
                self._pods[inc] = uid  # a stop from now on goes to its pod host
            self._handed.append((launch, uid, answer))
            del self._in_flight[inc]

    def _adopted(self, launch: Launch, uid: str, answer) -> list:
        """On the agent's loop, as ``poll`` takes what a pod host answered."""
        inc = launch.incarnation
        out: list = []
        if isinstance(answer, PodHostError):
            self._cannot_start(launch, str(answer), out)
            return out
        with self._lock:
            stopped = inc not in self._pods  # stopped, and its pod host gone, before this turn
        if stopped:
            return out
        self.hosts.follow(answer)
        key = (inc.job_id, inc.instance, inc.round, inc.start)
        # Adopted first: the node host binds the token to the process before its events.
        return [Adopted(inc, launch.token, answer.host_pid if answer.pod_pid else 0, key)]

    def _cannot_start(self, launch: Launch, why: str, out: list) -> None:
        """As a process that could not be executed: started, its one line, exit 127."""
        self.failed += 1
        inc = launch.incarnation
        now = self.hosts.clock()
        common = dict(job_id=inc.job_id, time=now, instance=inc.instance, round=inc.round, start=inc.start)
        out.append(InstanceStarted(**common, node=self.hosts.node, pid=0))
        out.append(LogLine(**common, text=f"trainwarden: the instance could not start in its pod: {why}",
                           stream=Stream.STDERR))
        out.append(InstanceExited(**common, exit_code=CANNOT_START))

    def stop(self, stopped: Sequence[Stopped], grace_s: float) -> None:
        """Each pod's host stops its incarnation; returns once every exit is
        written (or the pod host is gone: its exit is then 137, as a kill)."""
        asked: list[tuple[Incarnation, str]] = []
        for item in stopped:
            inc = item.incarnation
            with self._lock:
                waiting = self._waiting.get((inc.job_id, inc.instance))
                if waiting is not None and waiting[1].incarnation == inc:
                    del self._waiting[(inc.job_id, inc.instance)]  # never started: it never will
                    self._said.append(self._exit(inc, 128 + 15))
                    continue
                in_flight = self._in_flight.get(inc)
            if in_flight is not None:
                wait([in_flight])  # its pod host answers within ANSWER_S: then it is stopped as any other
            with self._lock:
                uid = self._pods.get(inc)
            if uid is None:
                continue  # ended already
            try:
                self.hosts.stop(uid, grace_s)
                asked.append((inc, uid))
            except PodHostError:
                self._gone(inc)
        deadline = time.monotonic() + grace_s + EXIT_WRITTEN_S
        for inc, uid in asked:
            exit_file = self.hosts.directory(uid) / f"{incarnation_stem(inc.round, inc.start)}.exit.json"
            while not exit_file.exists() and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if not exit_file.exists():
                self._gone(inc)

    def _gone(self, inc: Incarnation) -> None:
        """Its pod host is gone (the pod deleted, its node lost): so is the incarnation."""
        with self._lock:
            if self._pods.pop(inc, None) is None:
                return
            self.hosts.followed.pop((inc.job_id, inc.instance, inc.round, inc.start), None)
            self._said.append(self._exit(inc, 128 + 9))

    def _exit(self, inc: Incarnation, code: int) -> InstanceExited:
        return InstanceExited(job_id=inc.job_id, time=self.hosts.clock(), instance=inc.instance, round=inc.round,
                              start=inc.start, exit_code=code)
