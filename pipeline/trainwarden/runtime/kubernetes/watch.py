"""What the apiserver holds of one kind (the jobs' pods of a namespace, or
the nodes), kept current by one thread that lists once and then watches.

Shared by every job of an actuator (KubeSite holds one per namespace and
one for the nodes), for two reasons:
- a turn of the actuator's loop reads memory instead of asking the
  apiserver (before: two lists per job every second, which grows with the
  number of jobs and the width of each);
- a pod that Kubernetes takes away and deletes between two looks is still
  seen as it last was: an evicted pod's container ends within a second of
  the eviction and the pod is gone soon after, so a reader that only lists
  missed its ``DisruptionTarget`` and took the preemption for a crash.
  The last state of a deleted pod is kept ``GONE_KEEP_S``.

In sync means: the list was read and the watch since has not failed. Out of
sync (not started yet, the apiserver down, the version too old: 410 Gone),
``snapshot`` answers None and the reader lists for itself; the thread lists
again after a back-off. Each failure is counted and its text kept.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

GONE_KEEP_S = 60.0
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class Collection:
    """``kind`` is "pods" (of ``namespace`` carrying the label ``index_label``,
    indexed by its value) or "nodes" (every node, by name)."""

    def __init__(self, api, kind: str, namespace: str = "", index_label: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.index_label = index_label
        self.clock = clock
        self.synced = False
        self.errors = 0  # lists and watches that failed, counted
        self.last_error = ""
        self.lists = 0
        self._lock = threading.Lock()
        self._objects: dict[str, dict] = {}  # by uid
        self._index: dict[str, set[str]] = {}  # the index label's value -> uids (a job's pods)
        self._gone: dict[str, tuple[float, dict]] = {}  # by uid: when it went, its last state
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "Collection":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"watch-{self.kind}-{self.namespace or 'cluster'}")
            self._thread.start()
        return self

    def close(self) -> None:
        """The thread leaves at its next change or reconnection (it may be blocked reading)."""
        self._stopped.set()

    def snapshot(self, index_value: str = "") -> Optional[list[dict]]:
        """The objects (those whose index label has this value, when given),
        then the last state of those deleted lately; None out of sync."""
        with self._lock:
            if not self.synced:
                return None
            now = self.clock()
            for uid in [uid for uid, (went, _) in self._gone.items() if now - went > GONE_KEEP_S]:
                del self._gone[uid]
            if index_value:
                found = [self._objects[uid] for uid in self._index.get(index_value, ())]
            else:
                found = list(self._objects.values())
            return found + [obj for _, obj in self._gone.values() if self._matches(obj, index_value)]

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                items, version = self.api.listed(self.kind, self.namespace, self.index_label)
                self._replace(items)
                failures = 0
                for change, obj in self.api.watch(self.kind, version, self.namespace, self.index_label):
                    if self._stopped.is_set():
                        return
                    self._apply(change, obj)
            except Exception as exc:  # whatever the client raised: this thread must outlive it
                with self._lock:
                    self.synced = False
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self._stopped.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1

    def _replace(self, items: list[dict]) -> None:
        now = self.clock()
        fresh = {_uid(obj): obj for obj in items}
        with self._lock:
            # Deleted while nobody watched: their last state as seen.
            for uid, obj in self._objects.items():
                if uid not in fresh:
                    self._forget(uid, obj, now)
            self._objects = fresh
            self._index = {}
            for uid, obj in fresh.items():
                self._index.setdefault(self._value(obj), set()).add(uid)
            self.synced = True
            self.lists += 1

    def _apply(self, change: str, obj: dict) -> None:
        uid = _uid(obj)
        with self._lock:
            if change in ("ADDED", "MODIFIED"):
                self._objects[uid] = obj
                self._index.setdefault(self._value(obj), set()).add(uid)
            elif change == "DELETED":
                self._objects.pop(uid, None)
                uids = self._index.get(self._value(obj), set())
                uids.discard(uid)
                if not uids:
                    self._index.pop(self._value(obj), None)  # a job that ended leaves no key
                self._forget(uid, obj, self.clock())

    def _forget(self, uid: str, obj: dict, now: float) -> None:
        if self.kind != "pods":
            return  # a node that is gone is absent: that is its loss
        meta = obj.setdefault("metadata", {})
        # Force-deleted pods carry no deletionTimestamp; every kept one reads as being deleted.
        meta.setdefault("deletionTimestamp", "deleted")
        self._gone[uid] = (now, obj)

    def _value(self, obj: dict) -> str:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(self.index_label, "") if self.index_label else ""

    def _matches(self, obj: dict, index_value: str) -> bool:
        return not index_value or self._value(obj) == index_value


def _uid(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return meta.get("uid") or meta.get("name") or ""
