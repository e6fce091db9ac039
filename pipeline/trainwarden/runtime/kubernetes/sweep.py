"""The pods of jobs that ended while the apiserver did not answer: deleted
once it does. A job's end deletes every pod of it (runtime.finish); when
that fails (the apiserver down or refusing), the job is handed here and a
thread tries again, with a back-off, until a list of the job's pods comes
back empty. Kept in the actuator's memory only: an actuator that dies
meanwhile leaves those pods to the operator
(``kubectl delete pods -l trainwarden.io/job=JOB``; docs/OPERATIONS.md).
"""

from __future__ import annotations

import threading

from trainwarden.runtime.kubernetes.api import KubeError
from trainwarden.runtime.kubernetes.manifests import job_selector

BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


class Sweeper:
    def __init__(self, api):
        self.api = api
        self.errors = 0  # calls that failed meanwhile, counted
        self.last_error = ""
        self.swept = 0  # jobs whose pods were all deleted here
        self._jobs: dict[tuple[str, str], int] = {}  # (namespace, job id) -> the pods' grace
        self._lock = threading.Lock()
        self._work = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def later(self, namespace: str, job_id: str, grace_s: int) -> None:
        with self._lock:
            self._jobs[(namespace, job_id)] = grace_s
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="sweep-pods")
                self._thread.start()
        self._work.set()

    def waiting(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._jobs)

    def close(self) -> None:
        self._stopped.set()
        self._work.set()

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            self._work.wait()
            with self._lock:
                jobs = dict(self._jobs)
            if not jobs:
                self._work.clear()
                continue
            failed = False
            for (namespace, job_id), grace_s in sorted(jobs.items()):
                if self._sweep(namespace, job_id, grace_s):
                    with self._lock:
                        self._jobs.pop((namespace, job_id), None)
                        self.swept += 1
                else:
                    failed = True
            if failed:
                self._stopped.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
            else:
                failures = 0

    def _sweep(self, namespace: str, job_id: str, grace_s: int) -> bool:
        """True once the job has no pod left."""
        try:
            pods = self.api.pods(namespace, job_selector(job_id))
            for pod in pods:
                if not (pod.get("metadata") or {}).get("deletionTimestamp"):
                    self.api.delete_pod(pod["metadata"]["name"], namespace, grace_s)
            return not pods
        except KubeError as exc:
            self.errors += 1
            self.last_error = str(exc)
            return False
