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
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from gpurm.queues.tree import QueueTree
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ErrorCode, RequestError, RMSettings
from gpurm.rm.storage.store import RMStore, Rows, Snapshot, StoreWriteError, rows
from gpurm.rm.storage.writer import StoreWriter

T = TypeVar("T")

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
        self._pending: list[tuple[Rows, asyncio.Future[None]]] = []    # this turn of the loop's batches
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
        RequestError(UNAVAILABLE) with the reason, memory rolled back.

        The batches of one turn of the event loop go to the writer together, as one batch (merged in order: a
        later batch's version of a record wins, as in one transaction), and are answered together: one hand-over
        and one wake-up of the loop per group, not per request (at 1,000 submits a second these were a tenth of
        the submit's cost). A request is answered only after its group's transaction is on disk."""
        if not batch:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self.hand_over)
        self._pending.append((batch, done))
        try:
            await done
        except StoreWriteError as exc:
            self._failed(str(exc))
            raise RequestError(ErrorCode.UNAVAILABLE, self.error) from None

    def hand_over(self) -> None:
        """Give the batches waiting for this turn of the loop to the writer (call before anything that must be
        written after them: `call`, `close`)."""
        group, self._pending = self._pending, []
        if not group:
            return
        written = self.writer.commit(merge([batch for batch, _ in group]))
        loop = group[0][1].get_loop()

        def wake(_: object) -> None:           # on the writer thread: one wake-up of the loop for the group
            with contextlib.suppress(RuntimeError):        # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(_answer, group, written)

        written.add_done_callback(wake)

    def call(self, write: Callable[[], T]) -> Future[T]:
        """Run `write` (a store method that commits its own transaction) on the writer thread, after every batch
        committed before it (StoreWriter.call)."""
        self.hand_over()
        return self.writer.call(write)

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
        if self._pending:
            self.hand_over()
        self.writer.close()
        self.store.close()


def merge(batches: list[Rows]) -> Rows:
    """Several requests' rows as one batch, in order."""
    if len(batches) == 1:
        return batches[0]
    out = Rows()
    for b in batches:
        out.jobs += b.jobs
        out.containers += b.containers
        out.nodes += b.nodes
        out.meta += b.meta
    return out


def _answer(group: list[tuple[Rows, asyncio.Future[None]]], written: Future[None]) -> None:
    """Answer the requests of a group once its transaction is done (a request that went away meanwhile is not
    answered; its rows are written all the same)."""
    exc = written.exception()
    for _, done in group:
        if done.done():
            continue
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(StoreWriteError(str(exc)))


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
