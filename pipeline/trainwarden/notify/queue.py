"""The notifier's durable state: a directory, one file per pending delivery.

    NOTIFY_DIR/lock              flock: one notifier per directory (two would deliver twice)
    NOTIFY_DIR/pending/<seq>-<delivery_id>.json   a delivery not finished yet
    NOTIFY_DIR/dead/<delivery_id>.json            the last dead letters, for people to look at
    NOTIFY_DIR/done.log          ids of finished deliveries (delivered, dead, suppressed, disabled)
    NOTIFY_DIR/state.json        rate-limit windows and subscriptions disabled by 410 Gone
    NOTIFY_DIR/deliveries.jsonl  the delivery log (records.py)

Every file is written under a temporary name, fsync'd, renamed, and the
directory fsync'd, so after a crash a pending file is either whole or absent.
Finishing a delivery appends its id to ``done.log`` (fsync'd) before the
pending file is removed: a crash in between leaves a file whose id is done,
and it is dropped at start instead of being delivered again. The same log
makes a resubmitted event (a replayed decision) a no-op.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Optional

import msgspec

from trainwarden.durable import fsync_directory, state_directory, write_synced

DONE_KEEP = 100_000  # finished ids remembered for deduplication
DEAD_KEEP = 1000


class Entry(msgspec.Struct):
    """One pending delivery of one event to one subscription."""

    seq: int  # queue order; a subscription's entries go out in this order
    delivery_id: str
    event_id: str
    subscription: str
    job_id: str
    event_type: str
    time: float  # the event's time
    due: float  # not before this time (backoff, or a rate-limit window's end)
    body: str  # rendered once: every attempt sends the same bytes
    attempts: int = 0
    held: bool = False  # the latest event of a rate-limit window, sent at the window's end
    suppressed: int = 0  # events of this (subscription, job, type) not sent before it
    suppressed_since: float = 0.0
    last_error: str = ""
    last_status: int = 0


class QueueError(Exception):
    pass


def default_directory() -> Path:
    """$TRAINWARDEN_NOTIFY_DIR, else ``notify`` in the XDG state directory."""
    return state_directory("notify", "TRAINWARDEN_NOTIFY_DIR")


class DurableQueue:
    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.pending_dir = self.dir / "pending"
        self.dead_dir = self.dir / "dead"
        self.tmp_dir = self.dir / "tmp"
        for d in (self.pending_dir, self.dead_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.dir / "lock")
        self._io = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.bytes = 0
        self.done: OrderedDict[str, None] = OrderedDict()
        self.corrupt = 0
        self._load()

    # ------------------------------------------------------------ load

    def _load(self) -> None:
        for leftover in self.tmp_dir.iterdir():
            leftover.unlink(missing_ok=True)
        done_path = self.dir / "done.log"
        if done_path.exists():
            for line in done_path.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.strip():
                    self.done[line.strip()] = None
            while len(self.done) > DONE_KEEP:
                self.done.popitem(last=False)
            if len(self.done) * 2 < sum(1 for _ in open(done_path, "rb")):
                self._rewrite_done()
        for path in sorted(self.pending_dir.glob("*.json")):
            try:
                entry = msgspec.json.decode(path.read_bytes(), type=Entry)
            except (OSError, msgspec.DecodeError):
                # Cannot be read whole (disk damage): kept aside for people, never half-delivered.
                self.corrupt += 1
                os.replace(path, self.dead_dir / f"corrupt-{path.name}")
                continue
            if entry.delivery_id in self.done:
                path.unlink(missing_ok=True)  # finished just before a crash
                continue
            self.entries[entry.delivery_id] = entry
            self.bytes += len(entry.body)
        fsync_directory(self.pending_dir)

    @property
    def next_seq(self) -> int:
        return max((e.seq for e in self.entries.values()), default=0) + 1

    def heads(self, now: float) -> tuple[dict[str, Entry], list[Entry]]:
        """Each subscription's head (its oldest entry not waiting for a rate-limit
        window: deliveries of a subscription go out in order), and the held
        entries still waiting."""
        heads: dict[str, Entry] = {}
        waiting = []
        for entry in sorted(self.entries.values(), key=lambda e: e.seq):
            if entry.held and entry.due > now:
                waiting.append(entry)
            elif entry.subscription not in heads:
                heads[entry.subscription] = entry
        return heads, waiting

    def known(self, delivery_id: str) -> bool:
        return delivery_id in self.entries or delivery_id in self.done

    # ----------------------------------------------------------- write

    def put(self, entry: Entry) -> None:
        """Durable when it returns (file and directory fsync'd)."""
        with self._io:
            old = self.entries.get(entry.delivery_id)
            self._write(self.pending_dir / _name(entry), msgspec.json.encode(entry))
            fsync_directory(self.pending_dir)
            self.entries[entry.delivery_id] = entry
            self.bytes += len(entry.body) - (len(old.body) if old else 0)

    def finish(self, entries: Iterable[Entry], dead: bool = False) -> None:
        """Record the ids as done (durably), then drop their files; dead ones
        are kept in ``dead/`` for inspection."""
        entries = list(entries)
        if not entries:
            return
        with self._io:
            self._append_done([e.delivery_id for e in entries])
            for entry in entries:
                path = self.pending_dir / _name(entry)
                if dead:
                    self._write(self.dead_dir / f"{entry.delivery_id}.json", msgspec.json.encode(entry))
                path.unlink(missing_ok=True)
                if self.entries.pop(entry.delivery_id, None) is not None:
                    self.bytes -= len(entry.body)
            fsync_directory(self.pending_dir)
            if dead:
                self._prune_dead()

    def mark_done(self, delivery_ids: Iterable[str]) -> None:
        """Ids that never had a pending file (refused, disabled, suppressed)."""
        ids = [i for i in delivery_ids if i not in self.done]
        if ids:
            with self._io:
                self._append_done(ids)

    def read_state(self) -> dict[str, Any]:
        try:
            return msgspec.json.decode((self.dir / "state.json").read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return {}

    def write_state(self, state: dict[str, Any]) -> None:
        with self._io:
            self._write(self.dir / "state.json", msgspec.json.encode(state))
            fsync_directory(self.dir)

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # --------------------------------------------------------- helpers

    def _write(self, target: Path, data: bytes) -> None:
        temp = self.tmp_dir / (target.name + ".tmp")
        write_synced(temp, data, os.O_CREAT | os.O_TRUNC)
        os.replace(temp, target)

    def _append_done(self, ids: list[str]) -> None:
        write_synced(self.dir / "done.log", "".join(f"{i}\n" for i in ids).encode(), os.O_CREAT | os.O_APPEND)
        for i in ids:
            self.done[i] = None
        if len(self.done) > DONE_KEEP * 2:
            while len(self.done) > DONE_KEEP:
                self.done.popitem(last=False)
            self._rewrite_done()

    def _rewrite_done(self) -> None:
        self._write(self.dir / "done.log", "".join(f"{i}\n" for i in self.done).encode())
        fsync_directory(self.dir)

    def _prune_dead(self) -> None:
        files = sorted(self.dead_dir.iterdir(), key=lambda p: p.stat().st_mtime)
        for path in files[:-DEAD_KEEP] if len(files) > DEAD_KEEP else []:
            path.unlink(missing_ok=True)


def _name(entry: Entry) -> str:
    return f"{entry.seq:012d}-{entry.delivery_id}.json"


def _lock(path: Path) -> Optional[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        os.close(fd)
        raise QueueError(f"the notifier directory {path.parent} is in use by another notifier"
                         + (f" (process {holder})" if holder else "")) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
