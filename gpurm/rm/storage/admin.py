"""Offline care of an RM's store: check it, back it up, restore a backup (`gpurm admin store ...`).

`check` and `backup` may run beside a live RM (SQLite readers do not block its writer; the backup API copies a
consistent snapshot). `restore` replaces the store, so it refuses while an RM holds the state dir's lock and holds
that lock itself while it works; the store it replaces is kept beside it (state.db.replaced-<time>), never deleted.

A PostgreSQL store (`--url postgresql://...`) is checked the same way, backed up with `pg_dump` (custom format,
one consistent snapshot while the RM writes) and restored with `pg_restore --clean` into the database, refused
while an RM holds the store's lock (rm/storage/postgres.py), which restore holds itself while it works.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpurm.rm.storage.statedir import FILE_MODE, STORE, StateDirBusy, StateDirLock, backup_path, holder_pid
from gpurm.rm.storage.store import Damage, SqliteStore, StoreDamaged, StoreWriteError
from gpurm.rm.storage.url import POSTGRESQL, parse_store_url, redact


class StoreAdminError(Exception):
    """Bad input or a refusal: one line naming what and why."""


@dataclass
class CheckResult:
    path: Path | str      # the SQLite file, or the PostgreSQL URL without its password
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
        counts = store.counts()
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


# PostgreSQL (`--url`): pg_dump / pg_restore, which must be installed where the command runs.

def _pg_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StoreAdminError(f"{name} is not installed (or not on PATH): install the PostgreSQL client tools "
                              f"(Debian: apt-get install postgresql-client) to back up or restore a PostgreSQL store")
    return path


def _pg_url(url: str) -> str:
    try:
        parsed = parse_store_url(url)
    except ValueError as exc:
        raise StoreAdminError(f"--url: {exc}") from None
    if parsed.kind != POSTGRESQL:
        raise StoreAdminError("--url: only a postgresql:// store is named by URL; a SQLite store by --state-dir")
    return parsed.url


def check_url(url: str) -> CheckResult:
    """check_file for a PostgreSQL store."""
    from gpurm.rm.storage.postgres import PostgresStore

    url = _pg_url(url)
    try:
        store = PostgresStore(url)
    except (StoreDamaged, StoreWriteError) as exc:
        return CheckResult(redact(url), 0, 0, 0, [Damage("database", str(exc))])
    try:
        damage = store.check()
        counts = store.counts()
    finally:
        store.close()
    return CheckResult(store.where, counts[0], counts[1], counts[2], damage)


def _libpq_args(url: str) -> tuple[str, dict[str, str]]:
    """`url` as a conninfo string without its password, and the environment that carries the password (never on
    a command line, where `ps` shows it)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    env = dict(os.environ)
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = password
    return make_conninfo(**params), env


def _run_pg(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        tail = " ".join(done.stderr.split())[-400:] or f"exit {done.returncode}"
        raise StoreAdminError(f"{what} failed: {tail}")


def backup_url(url: str, to: Path) -> Path:
    """`pg_dump --format=custom` of the store into the new file `to` (0600; safe while the RM runs)."""
    url = _pg_url(url)
    pg_dump = _pg_tool("pg_dump")
    if to.exists():
        raise StoreAdminError(f"--to: {to} exists; pick a new file")
    if not to.parent.is_dir():
        raise StoreAdminError(f"--to: {to.parent} is not a directory")
    fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.close(fd)
    conninfo, env = _libpq_args(url)
    try:
        _run_pg([pg_dump, "--format=custom", "--no-owner", "--no-privileges", f"--file={to}",
                 f"--dbname={conninfo}"], f"pg_dump of {redact(url)}", env)
    except BaseException:
        with contextlib.suppress(OSError):
            to.unlink()
        raise
    return to


def restore_url(url: str, backup: Path) -> None:
    """Replace the store's tables with those of `backup` (a `backup_url` file): `pg_restore --clean --if-exists
    --single-transaction`, so a failed restore changes nothing. Refused while an RM holds the store; holds the
    store's lock itself meanwhile, so no RM starts on a half-restored store."""
    from gpurm.rm.storage.postgres import PostgresStore

    url = _pg_url(url)
    pg_restore = _pg_tool("pg_restore")
    if not backup.is_file():
        raise StoreAdminError(f"FILE: {backup} does not exist or is not a file")
    _run_pg([pg_restore, "--list", str(backup)], f"reading {backup} (a pg_dump --format=custom file?)")
    try:
        holder = PostgresStore(url, exclusive=True)
    except StoreWriteError as exc:
        raise StoreAdminError(f"{exc}; stop the RM before restoring its store" if "in use" in str(exc) else str(exc)
                              ) from None
    except StoreDamaged as exc:
        raise StoreAdminError(str(exc)) from None
    conninfo, env = _libpq_args(url)
    try:
        _run_pg([pg_restore, "--clean", "--if-exists", "--single-transaction", "--no-owner", "--no-privileges",
                 f"--dbname={conninfo}", str(backup)], f"pg_restore of {backup} into {redact(url)}", env)
    finally:
        holder.close()
    checked = check_url(url)
    if checked.damage:
        raise StoreAdminError(f"restored {backup}, but it does not read: {checked.damage[0]}")
