"""The watched copy of the jobs' pods and of the nodes (runtime/kubernetes/watch.py):
what a reader sees, on an apiserver played by a script of lists and watch changes."""

from __future__ import annotations

import queue
import threading

import pytest

from trainwarden.runtime.kubernetes.manifests import JOB_LABEL
from trainwarden.runtime.kubernetes.watch import GONE_KEEP_S, Collection


def pod(name, job="job-a", uid=None, **status):
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": {JOB_LABEL: job}},
            "status": status}


class ScriptedApiserver:
    """``lists`` answers each list in turn; a watch hands out the changes put
    on ``changes`` until it takes an exception, which it raises (the
    connection broke, or 410 Gone)."""

    def __init__(self, *lists):
        self.lists = list(lists)
        self.changes: queue.Queue = queue.Queue()
        self.watches: list[str] = []
        self.listed_twice = threading.Event()
        self.count = 0

    def listed(self, kind, namespace="", selector=""):
        answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, Exception):
            raise answer
        self.count += 1
        if self.count >= 2:
            self.listed_twice.set()
        return answer, str(self.count)

    def watch(self, kind, version, namespace="", selector=""):
        self.watches.append(version)
        while True:
            change = self.changes.get()
            if isinstance(change, Exception):
                raise change
            yield change


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def settled(collection, predicate, what, index="job-a"):
    """What the reader sees once the watching thread has made it true (at most 5 s)."""
    for _ in range(500):
        found = collection.snapshot(index)
        if found is not None and predicate(found):
            return found
        threading.Event().wait(0.01)
    raise AssertionError(f"{what}: {collection.snapshot(index)}")


@pytest.fixture
def clock():
    return Clock()


def test_a_reader_is_told_to_list_for_itself_until_the_first_list_is_read(clock):
    api = ScriptedApiserver(ConnectionError("the apiserver does not answer"))
    collection = Collection(api, "pods", "jobs", JOB_LABEL, clock=clock)
    assert collection.snapshot("job-a") is None  # not started: out of sync
    collection.start()
    for _ in range(300):
        if collection.errors:
            break
        threading.Event().wait(0.01)
    assert collection.snapshot("job-a") is None and collection.errors >= 1, collection.errors
    assert "does not answer" in collection.last_error
    collection.close()


def test_a_pod_deleted_between_two_looks_is_still_seen_as_it_last_was_with_its_disruption(clock):
    api = ScriptedApiserver([pod("a-0"), pod("a-1"), pod("b-0", job="job-b")])
    collection = Collection(api, "pods", "jobs", JOB_LABEL, clock=clock).start()
    try:
        settled(collection, lambda found: len(found) == 2, "the list")
        evicted = pod("a-1", conditions=[{"type": "DisruptionTarget", "status": "True",
                                          "reason": "EvictionByEvictionAPI"}])
        api.changes.put(("MODIFIED", evicted))
        api.changes.put(("DELETED", evicted))
        found = settled(collection, lambda found: any(p["metadata"].get("deletionTimestamp") for p in found),
                        "the deletion")
        [gone] = [p for p in found if p["metadata"]["name"] == "a-1"]
        assert gone["status"]["conditions"][0]["reason"] == "EvictionByEvictionAPI"
        assert sorted(p["metadata"]["name"] for p in found) == ["a-0", "a-1"]  # job-b's pod is not job-a's
        clock.now += GONE_KEEP_S + 1
        assert [p["metadata"]["name"] for p in collection.snapshot("job-a")] == ["a-0"]
    finally:
        collection.close()


def test_after_a_broken_watch_it_lists_again_and_keeps_what_vanished_meanwhile(clock):
    api = ScriptedApiserver([pod("a-0"), pod("a-1")], [pod("a-0")])
    collection = Collection(api, "pods", "jobs", JOB_LABEL, clock=clock).start()
    try:
        settled(collection, lambda found: len(found) == 2, "the list")
        api.changes.put(ConnectionResetError("the watch broke"))  # a-1 is deleted while nobody watches
        assert api.listed_twice.wait(5)
        found = settled(collection, lambda found: any(p["metadata"].get("deletionTimestamp") for p in found),
                        "the second list")
        assert {p["metadata"]["name"]: bool(p["metadata"].get("deletionTimestamp")) for p in found} == {
            "a-0": False, "a-1": True}
        assert collection.errors == 1 and collection.lists == 2 and "the watch broke" in collection.last_error
    finally:
        collection.close()


def test_a_node_deleted_is_absent_not_kept(clock):
    node = {"metadata": {"name": "n2", "uid": "n2"}, "status": {}}
    api = ScriptedApiserver([{"metadata": {"name": "n1", "uid": "n1"}}, node])
    collection = Collection(api, "nodes", clock=clock).start()
    try:
        settled(collection, lambda found: len(found) == 2, "the list", index="")
        api.changes.put(("DELETED", node))
        settled(collection, lambda found: [n["metadata"]["name"] for n in found] == ["n1"], "the deletion", index="")
    finally:
        collection.close()
