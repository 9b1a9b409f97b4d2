"""A damaged store is named, not a traceback: records name the bad field, the store names the record and the way
out, `check` lists every damaged thing, backups rotate, restore refuses a held state dir and keeps what it
replaces. Real SQLite files; no sockets."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job, JobState
from gpurm.rm.config import load_rm_config
from gpurm.rm.storage.admin import StoreAdminError, check_store, restore_store
from gpurm.rm.storage.records import RecordError, from_dict, to_dict
from gpurm.rm.storage.statedir import StateDirBusy, StateDirLock, backups, rotate_backup
from gpurm.rm.storage.store import STORED_FIELD_TYPES, SqliteStore, StoreDamaged


def job(n: int) -> Job:
    return Job(f"job-{n}", JobSpec(gpus=1, command=["x"]), "alice", "root.default", 1.0, seq=n)


def test_a_record_names_the_bad_field() -> None:
    data = to_dict(job(1))
    assert from_dict(Job, data, STORED_FIELD_TYPES) == job(1)
    with pytest.raises(RecordError, match=r"^state: unknown JobState value 'HIBERNATING' \(written by a newer"):
        from_dict(Job, {**data, "state": "HIBERNATING"}, STORED_FIELD_TYPES)
    nested = json.loads(json.dumps(data))
    nested["spec"]["locality"]["start_level"] = "MOON"
    with pytest.raises(RecordError, match=r"^spec\.locality\.start_level: unknown LocalityLevel value 'MOON'"):
        from_dict(Job, nested, STORED_FIELD_TYPES)
    with pytest.raises(RecordError, match=r"^user: missing"):
        from_dict(Job, {k: v for k, v in data.items() if k != "user"}, STORED_FIELD_TYPES)
    with pytest.raises(RecordError, match="a mapping"):
        from_dict(Job, ["not", "a", "record"], STORED_FIELD_TYPES)  # type: ignore[arg-type]
    assert from_dict(Job, {**data, "field_from_the_future": 1}, STORED_FIELD_TYPES).state is JobState.QUEUED


def damaged_store(path: Path) -> None:
    store = SqliteStore(path)
    store.save([job(1), job(2)], [], [], {})
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET data=? WHERE job_id='job-2'", (json.dumps({**to_dict(job(2)), "state": "X"}),))
        db.execute("INSERT INTO jobs VALUES ('job-3', 3, 'QUEUED', 'not json')")
    db.close()


def test_load_names_the_record_and_check_lists_every_damaged_one(tmp_path: Path) -> None:
    damaged_store(tmp_path / "state.db")
    store = SqliteStore(tmp_path / "state.db")
    with pytest.raises(StoreDamaged) as exc:
        store.load()
    line = str(exc.value)
    assert "\n" not in line and "jobs job-2: state: unknown JobState value 'X'" in line
    assert f"gpurm admin store check --state-dir {tmp_path}" in line
    store.close()
    result = check_store(tmp_path)
    assert result.jobs == 3
    assert [str(d) for d in result.damage] == ["jobs job-2: state: unknown JobState value 'X' (written by a newer "
                                               "gpurm?)", "jobs job-3: not JSON (Expecting value: line 1 column 1 "
                                               "(char 0))"]


def test_a_file_that_is_not_a_store_is_named(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreDamaged, match=r"cannot be read \(file is not a database\); list what is damaged"):
        SqliteStore(tmp_path / "state.db")
    assert [d.where for d in check_store(tmp_path).damage] == ["file"]
    with pytest.raises(StoreAdminError, match="holds no RM store"):
        check_store(tmp_path / "elsewhere")


def test_one_lock_per_state_dir_naming_the_holder(tmp_path: Path) -> None:
    with StateDirLock(tmp_path / "rm"):
        with pytest.raises(StateDirBusy) as busy:
            StateDirLock(tmp_path / "rm").acquire()
        assert busy.value.pid == os.getpid()
        assert f"state dir {tmp_path / 'rm'} is in use by another RM (pid {os.getpid()})" in str(busy.value)
    StateDirLock(tmp_path / "rm").acquire()      # released: the next one may take it
    assert stat.S_IMODE((tmp_path / "rm").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "rm" / "rm.lock").stat().st_mode) == 0o600


def test_backups_rotate_and_restore_keeps_what_it_replaces(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.save([job(1)], [], [], {})
    made = [rotate_backup(store, tmp_path, keep=2) for _ in range(3)]
    assert all(made) and backups(tmp_path) == made[1:]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in backups(tmp_path))
    store.save([job(2)], [], [], {})
    store.close()

    with StateDirLock(tmp_path), pytest.raises(StoreAdminError, match=f"pid {os.getpid()}"):
        restore_store(tmp_path, backups(tmp_path)[-1])
    kept = restore_store(tmp_path, backups(tmp_path)[-1])
    assert [j.job_id for j in SqliteStore(tmp_path / "state.db").load().jobs] == ["job-1"]
    assert [j.job_id for j in SqliteStore(kept).load().jobs] == ["job-1", "job-2"]

    damaged_store(tmp_path / "bad.db")
    with pytest.raises(StoreAdminError, match="is damaged too"):
        restore_store(tmp_path, tmp_path / "bad.db")


def test_shutdown_and_store_settings(tmp_path: Path) -> None:
    cfg = load_rm_config(None, {"shutdown": {"grace": "1s", "timeout": "4s"}, "store": {"backups": 3}})
    assert (cfg.shutdown_grace_s, cfg.shutdown_timeout_s, cfg.store_backups) == (1.0, 4.0, 3)
    with pytest.raises(ConfigError, match=r"shutdown\.timeout: must be above grace \(5s\), got 2s"):
        load_rm_config(None, {"shutdown": {"grace": "5s", "timeout": "2s"}})
