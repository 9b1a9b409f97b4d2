"""Removing the dirs (record, output logs, launcher log) of containers that ended long ago (agent.yaml
`containers.keep_finished`, default 7d; `never` keeps them).

A dir goes only when all of these hold: its record on disk reads as ended (never a live container's, nor one
whose record cannot be read), it ended more than `keep_finished` ago, and the supervisor no longer tracks it (a
container whose end the RM has not acknowledged stays). A pass removes at most `limit` dirs and runs every
`sweep_interval` (a tenth of keep_finished, between a minute and an hour), in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Container, Iterable
from pathlib import Path

from gpurm.nodeagent.records import read_record, safe_container_id

log = logging.getLogger(__name__)

NEVER = float("inf")
DEFAULT_KEEP_S = 7 * 86400.0
SWEEP_LIMIT = 500


def sweep_interval(keep_s: float) -> float:
    return min(3600.0, max(60.0, keep_s / 10))


def sweep_ended(containers_dir: Path, keep_s: float, now: float, tracked: Container[str],
                limit: int = SWEEP_LIMIT) -> list[str]:
    """Remove the dirs of containers that ended before `now - keep_s` and that the supervisor does not track
    (`tracked`: container ids). Returns the ids removed."""
    if keep_s == NEVER:
        return []
    cutoff_ms = (now - keep_s) * 1000
    removed: list[str] = []
    try:
        entries = list(os.scandir(containers_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if len(removed) >= limit:
            break
        name = entry.name
        if not safe_container_id(name) or not entry.is_dir(follow_symlinks=False) or name in tracked:
            continue
        rec = read_record(Path(entry.path))
        if rec is None or rec.container_id != name or not rec.terminal or not rec.end_ms or rec.end_ms > cutoff_ms:
            continue
        try:
            shutil.rmtree(entry.path)
        except OSError as exc:
            log.warning("cannot remove the dir of ended container %s: %s", name, exc)
            continue
        removed.append(name)
    return removed


async def sweep_loop(containers_dir: Path, keep_s: float, tracked: Callable[[], Iterable[str]],
                     clock: Callable[[], float]) -> None:
    """Sweep every `sweep_interval(keep_s)` forever (none when keep_s is NEVER)."""
    if keep_s == NEVER:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(sweep_interval(keep_s))
        try:
            gone = await asyncio.to_thread(sweep_ended, containers_dir, keep_s, clock(), set(tracked()))
        except Exception:
            log.exception("sweeping ended containers' dirs failed")
            continue
        if gone:
            log.info("removed the dirs of %d containers that ended over %gs ago (containers.keep_finished)",
                     len(gone), keep_s)
