"""Fail closed on the store: nothing the RM did is acknowledged or acted on before it is on disk.

The rules (docs/security.md, "The RM's store"):

- Every mutating request runs its core call, then `Persister.commit` writes what changed (SQLite,
  synchronous=FULL, on the writer thread, in one transaction with the other requests waiting then: group commit,
  rm/storage/writer.py) before the reply and before any effect (AM launch, stop order, MQTT publish).
- When the write fails (a full disk, a read-only or failing device), the request fails with UNAVAILABLE and the
  reason; it is never acknowledged, nor is any request of the same transaction or queued behind it. Memory is
  then rolled back to the disk: the core is rebuilt from the store exactly as after an RM restart
  (`rebuild_core`), so the refused change leaves no trace, and the effects the core had queued are dropped with
  it. Agents re-register and AMs re-sync as after any restart.
- While the store refuses writes, every mutating request fails UNAVAILABLE with the same reason before it
  changes anything (reads still work, from memory), the periodic core work pauses, and `GetClusterInfo` shows the
  error (`store_error`). The RM tries a small write every `RETRY_S` seconds and takes writes again once one
  succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpurm.queues.tree import QueueTree
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ErrorCode, RequestError, RMSettings
from gpurm.rm.storage.store import RMStore, Rows, Snapshot, StoreWriteError, rows
from gpurm.rm.storage.writer import StoreWriter

log = logging.getLogger(__name__)

RETRY_S = 1.0
PROBE_KEY = "store_probe"


def write_failure(error: str, remedy: str) -> str:
    return f"the RM's store cannot be written: {error}; {remedy}"


class Persister:
    """Writes the core's changes through the group-commit writer, and refuses writes while the store is broken
    (see the module's rules)."""

    def __init__(self, store: RMStore, state_dir: Path, on_failure: Callable[[], None]) -> None:
        """`on_failure`: rolls memory back to the store; called once per failed write."""
        self.store = store
        self.writer = StoreWriter(store)
        self.state_dir = state_dir
        self.on_failure = on_failure
        self.error = ""          # non-empty while writes are refused
        self.since = 0.0
        self.failures = 0

    @property
    def writable(self) -> bool:
        return not self.error

    def check_writable(self) -> None:
        """RequestError(UNAVAILABLE) while the store refuses writes: call before changing anything."""
        if self.error:
            raise RequestError(ErrorCode.UNAVAILABLE, self.error)

    async def commit(self, batch: Rows) -> None:
        """Wait until `batch` is on disk (group commit, off the event loop), or fail the request:
        RequestError(UNAVAILABLE) with the reason, memory rolled back."""
        if not batch:
            return
        try:
            await asyncio.wrap_future(self.writer.commit(batch))
        except StoreWriteError as exc:
            self._failed(str(exc))
            raise RequestError(ErrorCode.UNAVAILABLE, self.error) from None

    def _failed(self, error: str) -> None:
        if self.error:
            return       # the same failure, seen by another request of its transaction: rolled back already
        self.error = write_failure(error, self.store.remedy)
        self.since = time.time()
        self.failures += 1
        log.error("%s; refusing writes until the store works again (reads still served)", self.error)
        try:
            self.on_failure()
        except Exception:
            log.exception("could not roll the RM's memory back to its store")

    async def try_resume(self) -> bool:
        """One small write to see whether the store works again; True (and writes taken again) if it does."""
        if not self.error:
            return True
        self.writer.reset()
        try:
            await asyncio.wrap_future(self.writer.commit(rows([], [], [], {PROBE_KEY: repr(time.time())})))
        except StoreWriteError as exc:
            self.error = write_failure(str(exc), self.store.remedy)
            return False
        log.warning("the RM's store can be written again after %.0f s; taking writes", time.time() - self.since)
        self.error = ""
        return True

    def close(self) -> None:
        """Finish the queued writes, then close the store."""
        self.writer.close()
        self.store.close()


def rebuild_core(store: RMStore, settings: RMSettings, tree: QueueTree, old: RMCore, now: float,
                 snap: Snapshot | None = None) -> RMCore:
    """A core holding exactly what the store holds (as after a restart), its view version past `old`'s so every
    watcher takes the next view, every node marked changed. What restoring queues (effects, dirty records) is
    kept for the next successful commit, as a restarted RM's first flush would carry it out."""
    if snap is None:
        snap = store.load()
    core = RMCore(settings, tree)
    core.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, now, snap.learned)
    core.cluster.version = max(core.cluster.version, old.cluster.version) + 1
    core.cluster.changed.update(core.cluster.nodes)
    return core
