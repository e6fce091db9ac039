"""The actuator's view of the cluster: nodes, their states, and where each
job's instances are placed. No I/O: heartbeats and times come in as data.

A node's liveness is judged on the actuator's clock alone: a heartbeat counts
as heard when it arrived (``heartbeat(beat, arrived_at)``, or else at the next
time the view is given, by ``expire`` or ``place``), never at the agent's
``time``, which is another host's clock: a skew would make a node look lost
(agent behind) or immortal (agent ahead)."""

from __future__ import annotations

import collections

import dataclasses
import enum
import hashlib
from typing import Callable, Optional

from trainwarden.bus.messages import Heartbeat


class NodeStatus(str, enum.Enum):
    READY = "ready"
    ISOLATED = "isolated"  # by a decision or an operator: no new instances until uncordoned
    LOST = "lost"  # no heartbeat for the node timeout, or it said it was leaving


@dataclasses.dataclass
class Node:
    name: str
    slots: int = 0
    address: str = "127.0.0.1"
    last_seen: float = 0.0  # when its latest heartbeat arrived, on the actuator's clock
    unstamped: bool = False  # a heartbeat arrived that has no time of arrival yet
    status: NodeStatus = NodeStatus.READY
    isolated: bool = False  # remembered across loss: an isolated node comes back isolated
    reason: str = ""
    running: tuple = ()  # RunningInstance of the last heartbeat


class NoCapacity(Exception):
    pass


class Cluster:
    def __init__(self, node_timeout_s: float):
        self.node_timeout_s = node_timeout_s
        self.nodes: dict[str, Node] = {}
        # job -> instance -> node
        self.placement: dict[str, dict[str, str]] = {}
        # (job, instance, round, start) -> the nodes whose last heartbeat
        # reports it: built once per heartbeat heard, not scanned per instance.
        self._runs: Optional[dict[tuple[str, str, int, int], list[str]]] = None

    def heartbeat(self, beat: Heartbeat, arrived_at: Optional[float] = None) -> Optional[NodeStatus]:
        """Record a heartbeat that arrived at ``arrived_at`` (the actuator's
        clock; None: at the next ``expire`` or ``place``); returns the node's
        new status if it changed."""
        node = self.nodes.setdefault(beat.node, Node(beat.node))
        node.slots, node.address, node.running = beat.slots, beat.address, beat.running
        self._runs = None
        if arrived_at is None:
            node.unstamped = True
        else:
            node.last_seen = max(node.last_seen, arrived_at)
        if beat.leaving:
            return self._set(node, NodeStatus.LOST, "the agent left")
        if node.status is NodeStatus.LOST:
            return self._set(node, NodeStatus.ISOLATED if node.isolated else NodeStatus.READY, "heartbeat again")
        return None

    def set_isolated(self, name: str, isolated: bool, reason: str) -> Optional[NodeStatus]:
        node = self.nodes.setdefault(name, Node(name))
        node.isolated = isolated
        if node.status is NodeStatus.LOST:
            node.reason = reason
            return None
        return self._set(node, NodeStatus.ISOLATED if isolated else NodeStatus.READY, reason)

    def expire(self, now: float) -> list[str]:
        """Nodes that just became lost."""
        self._stamp(now)
        lost = []
        for node in self.nodes.values():
            if node.status is not NodeStatus.LOST and now - node.last_seen > self.node_timeout_s:
                self._set(node, NodeStatus.LOST, f"no heartbeat for {now - node.last_seen:.0f} s")
                lost.append(node.name)
        return lost

    def _stamp(self, now: float) -> None:
        for node in self.nodes.values():
            if node.unstamped:
                node.last_seen, node.unstamped = max(node.last_seen, now), False

    def _set(self, node: Node, status: NodeStatus, reason: str) -> Optional[NodeStatus]:
        if node.status is status:
            return None
        node.status, node.reason = status, reason
        return status

    def running_at(self, job_id: str, instance: str, round_: int, start: int) -> list[str]:
        """The nodes whose last heartbeat reports this incarnation (running, or held to start there)."""
        if self._runs is None:
            runs: dict[tuple[str, str, int, int], list[str]] = {}
            for node in sorted(self.nodes.values(), key=lambda n: n.name):
                for r in node.running:
                    runs.setdefault((r.job_id, r.instance, r.round, r.start), []).append(node.name)
            self._runs = runs
        return list(self._runs.get((job_id, instance, round_, start), ()))

    # ----------------------------------------------------------- placement

    def used(self, name: str) -> int:
        return sum(1 for job in self.placement.values() for node in job.values() if node == name)

    def place(self, job_id: str, instance: str, now: float, prefer: Optional[str] = None,
              held: Callable[[str], int] = lambda node: 0) -> Node:
        """A ready node, heard from within the timeout, with a free slot: the
        preferred one if possible, else the least used, among those with a
        slot beyond ``held(node)`` (slots kept for instances coming back
        there) if any. A node known only from the state topic (no heartbeat
        yet) is never a candidate."""
        self._stamp(now)
        placed = self.placement.setdefault(job_id, {})
        placed.pop(instance, None)
        # Counted once per placement, not once per node (a round of a wide job places every instance).
        used = collections.Counter(node for job in self.placement.values() for node in job.values())
        candidates = [n for n in self.nodes.values()
                      if n.status is NodeStatus.READY and n.last_seen and now - n.last_seen <= self.node_timeout_s
                      and used[n.name] < n.slots]
        if not candidates:
            raise NoCapacity(f"no ready node has a free slot for {job_id}/{instance}")
        chosen = next((n for n in candidates if n.name == prefer), None)
        if chosen is None:
            unheld = [n for n in candidates if used[n.name] + held(n.name) < n.slots]
            chosen = min(unheld or candidates, key=lambda n: (used[n.name], n.name))
        placed[instance] = chosen.name
        return chosen

    def release(self, job_id: str, instances: Optional[list[str]] = None) -> dict[str, list[str]]:
        """Forget where these instances are; returns node -> instances, to stop them there."""
        placed = self.placement.get(job_id, {})
        by_node: dict[str, list[str]] = {}
        for instance in list(placed if instances is None else instances):
            node = placed.pop(instance, None)
            if node is not None:
                by_node.setdefault(node, []).append(instance)
        return by_node

    def on_node(self, name: str) -> dict[str, list[str]]:
        """job -> instances placed on this node."""
        found: dict[str, list[str]] = {}
        for job_id, placed in self.placement.items():
            for instance, node in placed.items():
                if node == name:
                    found.setdefault(job_id, []).append(instance)
        return found


def master_port(job_id: str, round_: int) -> int:
    """A port for the job's rendezvous in this round, the same from any actuator."""
    digest = hashlib.sha256(f"{job_id}/{round_}".encode()).digest()
    return 20000 + int.from_bytes(digest[:4], "big") % 20000
