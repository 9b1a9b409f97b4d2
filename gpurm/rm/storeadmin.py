"""Offline care of an RM's store: check it, back it up, restore a backup (`gpurm admin store ...`).

`check` and `backup` may run beside a live RM (SQLite readers do not block its writer; the backup API copies a
consistent snapshot). `restore` replaces the store, so it refuses while an RM holds the state dir's lock and holds
that lock itself while it works; the store it replaces is kept beside it (state.db.replaced-<time>), never deleted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from gpurm.rm.statedir import FILE_MODE, STORE, StateDirBusy, StateDirLock, backup_path, holder_pid
from gpurm.rm.store import Damage, SqliteStore, StoreDamaged, StoreWriteError


class StoreAdminError(Exception):
    """Bad input or a refusal: one line naming what and why."""


@dataclass
class CheckResult:
    path: Path
    jobs: int
    containers: int
    nodes: int
    damage: list[Damage]


def store_path(state_dir: Path) -> Path:
    path = state_dir / STORE
    if not path.is_file():
        raise StoreAdminError(f"--state-dir: {state_dir} holds no RM store ({STORE} is missing)")
    return path


def check_file(path: Path) -> CheckResult:
    """Read every record of the store at `path`; what cannot be read is listed in `damage`."""
    try:
        store = SqliteStore(path)
    except (StoreDamaged, StoreWriteError) as exc:
        return CheckResult(path, 0, 0, 0, [Damage("file", str(exc).split("; ")[0])])
    try:
        damage = store.check()
        counts = []
        for table in ("jobs", "containers", "nodes"):
            try:
                counts.append(int(store._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))
            except sqlite3.Error:
                counts.append(0)
    finally:
        store.close()
    return CheckResult(path, counts[0], counts[1], counts[2], damage)


def check_store(state_dir: Path) -> CheckResult:
    return check_file(store_path(state_dir))


def backup_store(state_dir: Path, to: Path | None = None) -> Path:
    """An online copy of the store (safe while the RM runs) at `to`, by default a new file in the backups
    folder. Refuses to overwrite an existing file."""
    source = store_path(state_dir)
    target = to if to is not None else backup_path(state_dir)
    if target.exists():
        raise StoreAdminError(f"--to: {target} exists; pick a new file")
    if not target.parent.is_dir():
        if to is not None:
            raise StoreAdminError(f"--to: {target.parent} is not a directory")
        target.parent.mkdir(mode=0o700, parents=True)
    try:
        _copy_db(source, target)
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            target.unlink()
        raise StoreAdminError(f"cannot back up {source} to {target}: {exc}") from None
    return target


def _copy_db(source: Path, target: Path) -> None:
    """SQLite's online backup of `source` (read-only) into the new file `target`, made with mode 0600 first."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.close(fd)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dest = sqlite3.connect(str(target))
    try:
        src.backup(dest)
    finally:
        dest.close()
        src.close()


def restore_store(state_dir: Path, backup: Path) -> Path:
    """Make `backup` the store of `state_dir`. Refuses while an RM holds the state dir, and refuses a backup
    that is damaged itself. Returns where the replaced store was kept."""
    if not backup.is_file():
        raise StoreAdminError(f"FILE: {backup} does not exist or is not a file")
    if not state_dir.is_dir():
        raise StoreAdminError(f"--state-dir: {state_dir} is not a directory")
    lock = StateDirLock(state_dir)
    try:
        lock.acquire()
    except StateDirBusy:
        pid = holder_pid(state_dir)
        raise StoreAdminError(f"an RM ({f'pid {pid}' if pid else 'another process'}) holds {state_dir}; stop it "
                              "before restoring its store") from None
    try:
        checked = check_file(backup)
        if checked.damage:
            raise StoreAdminError(f"FILE: {backup} is damaged too ({checked.damage[0]}); pick another backup")
        current = state_dir / STORE
        kept = state_dir / f"{STORE}.replaced-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        n = 1
        while kept.exists():
            n += 1
            kept = kept.with_name(f"{kept.name.split('~')[0]}~{n}")
        if current.exists():
            os.rename(current, kept)
            for suffix in ("-wal", "-shm"):     # SQLite finds them by name: they travel with their file
                side = current.with_name(current.name + suffix)
                if side.exists():
                    os.rename(side, kept.with_name(kept.name + suffix))
        _copy_db(backup, current)
    except (sqlite3.Error, OSError) as exc:
        raise StoreAdminError(f"cannot restore {backup} into {state_dir}: {exc}") from None
    finally:
        lock.release()
    return kept
