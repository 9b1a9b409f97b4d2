"""The RM's state directory: private (0700, files 0600), held by one RM at a time, with rolling backups.

One RM per state dir: `StateDirLock` takes an exclusive `flock` on `rm.lock` for the RM's whole life (the kernel
drops it when the process dies, even on SIGKILL, so a crash leaves no stale lock) and writes its pid there, so a
second RM — or `gpurm admin store restore` — can say who holds it. Files this module does not know are left
alone (other parts keep their own files here).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

from gpurm.rm.storage.store import BACKUPS, SqliteStore

log = logging.getLogger(__name__)

LOCK = "rm.lock"
STORE = "state.db"
DIR_MODE = 0o700
FILE_MODE = 0o600


class StateDirBusy(Exception):
    """Another process holds the state dir's lock. The message names the dir and the holder's pid."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"state dir {state_dir} is in use by another RM ({who}); stop it first, or give this "
                         "RM its own state_dir")
        self.pid = pid


def holder_pid(state_dir: Path) -> int | None:
    """The pid written in the lock file (the holder's, while it is held)."""
    try:
        text = (state_dir / LOCK).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def make_private(state_dir: Path) -> None:
    """Create `state_dir` if needed and make it and the files in it (one level, and the backups) owner-only."""
    state_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(state_dir, DIR_MODE)
    for folder in (state_dir, state_dir / BACKUPS):
        if not folder.is_dir():
            continue
        if folder != state_dir:
            os.chmod(folder, DIR_MODE)
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                if entry.is_file() and not entry.is_symlink() and entry.stat().st_mode & 0o077:
                    os.chmod(entry, FILE_MODE)


class StateDirLock:
    """An exclusive lock on a state dir, held until `release` (or until the process ends)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write this pid in it; StateDirBusy if another process holds it."""
        make_private(self.state_dir)
        fd = os.open(self.state_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(self.state_dir, holder_pid(self.state_dir)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)     # closing drops the flock
            self._fd = None

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def backup_path(state_dir: Path, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    folder = state_dir / BACKUPS
    path = folder / f"state-{stamp}.db"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"state-{stamp}-{n}.db"
    return path


def backups(state_dir: Path) -> list[Path]:
    """The automatic backups, oldest first."""
    folder = state_dir / BACKUPS
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob("state-*.db") if p.is_file()), key=lambda p: (p.stat().st_mtime, p.name))


def rotate_backup(store: SqliteStore, state_dir: Path, keep: int) -> Path | None:
    """Write a backup of `store` into the backups folder and keep only the newest `keep`. A failure (a full
    disk) is logged and costs nothing but the backup."""
    if keep <= 0:
        return None
    folder = state_dir / BACKUPS
    target = backup_path(state_dir)
    try:
        folder.mkdir(mode=DIR_MODE, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.close(fd)
        store.backup(target)
    except Exception as exc:   # sqlite3.Error or OSError: a backup is a convenience, never a reason to stop
        log.warning("could not back up the store to %s: %s", target, exc)
        with contextlib.suppress(OSError):
            target.unlink()
        return None
    for old in backups(state_dir)[:-keep]:
        with contextlib.suppress(OSError):
            old.unlink()
    return target
