"""Finished jobs as the RM's shell keeps them: the retention pass that moves them out of memory (their records into
the store's `retired` table, written before memory forgets them) and their detail out of the store later, and the
answers for a job that has left memory (read back from the store, or NOT_FOUND saying when it was retired).

What leaves and when is decided by the pure rm/state/retention.py; the tables are rm/storage/retired.py. RMShell
(rm/server/daemon.py) runs a pass from its tick loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from gpurm.common.model import Container, Job
from gpurm.rm.config import RMConfig
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ErrorCode, RequestError
from gpurm.rm.state.retention import Retention
from gpurm.rm.storage.persist import Persister
from gpurm.rm.storage.store import RMStore, StoreWriteError

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line


class FinishedJobs:
    def __init__(self, core: Callable[[], RMCore], store: RMStore, persist: Persister, retention: Retention,
                 config: RMConfig, clear_job: Callable[[str], None], usage: dict[str, str],
                 rightsize: dict[str, str]) -> None:
        """`core`: the shell's core now (a failed write replaces it). `clear_job`: clears a job's retained MQTT
        event. `usage`, `rightsize`: the shell's per-container summaries, dropped with the job's containers."""
        self._core = core
        self.store = store
        self.persist = persist
        self.retention = retention
        self.config = config
        self._clear_job = clear_job
        self._usage = usage
        self._rightsize = rightsize

    async def retire(self, now: float) -> int:
        """One retention pass: finished jobs past `retention.memory` leave memory (their records move to the
        store's `retired` table in one transaction, written before memory forgets them) and their retained MQTT
        topics are cleared; detail past `retention.store` leaves the store. Returns the jobs retired."""
        if not self.persist.writable:
            return 0
        p = self.retention.plan(self._core(), now)
        if not p.retired and p.purge_before is None:
            return 0
        try:
            # On the writer thread, after the writes queued before it (the jobs' last saves among them).
            purged = await asyncio.wrap_future(self.persist.call(
                lambda: self.store.retire(p.retired, p.purge_before, self.retention.settings.batch)))
        except StoreWriteError as exc:
            self.retention.give_back(p)    # memory still holds them; the next pass tries again
            log.warning("finished jobs not retired (the store refused the write: %s); trying again", exc)
            return 0
        self.retention.apply(self._core(), p)
        self.retention.purged(purged)
        for r in p.retired:
            self._clear_job(r.job.job_id)
            for c in r.containers:
                self._usage.pop(c.container_id, None)
                self._rightsize.pop(c.container_id, None)
        if p.retired or purged:
            log.info("retention: %d finished jobs left memory, %d jobs' detail left the store", len(p.retired),
                     purged)
        return len(p.retired)

    def records(self, job_id: str) -> tuple[Job, Mapping[str, Container]]:
        """A job and its containers by id: from memory, else (a job that left memory) from the store, so its logs
        stay readable while the agents keep them (agent.yaml containers.keep_finished)."""
        core = self._core()
        job = core.jobs.get(job_id)
        if job is not None:
            return job, core.containers
        found = self.store.load_retired(job_id)
        if found is None:
            return self.find(job_id), {}       # raises NOT_FOUND, saying why
        return found[0], {c.container_id: c for c in found[1]}

    def find(self, job_id: str) -> Job:
        """A job in memory, else one that left memory read from the store (off the hot path: `gpurm status`);
        NOT_FOUND saying so when its detail has left the store too."""
        try:
            return self._core().get_job(job_id)
        except RequestError as exc:
            if exc.code is not ErrorCode.NOT_FOUND or not job_id:
                raise
            found = self.store.load_retired(job_id)
            if found is not None:
                return found[0]
            row = self.store.finished_row(job_id)
            if row is None:
                raise
            ret = self.config.retention
            raise RequestError(ErrorCode.NOT_FOUND, f"job {job_id} finished ({row.state}) at "
                               f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(row.finish_time))} and its record "
                               f"was retired after {ret.store_s / 86400:g} days (rm.yaml retention.store); "
                               f"`gpurm acct` still counts it") from None
