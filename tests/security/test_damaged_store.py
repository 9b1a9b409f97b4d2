"""A damaged store (garbage, a truncated file, a record with an unknown enum value written by a newer version, a
missing field) crashed the RM at start with a traceback. Now the RM exits 2 with one line naming what is damaged
and the way out, `gpurm admin store check` lists the damage, and `restore` brings back an automatic backup."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from gpurm.rm.storage.statedir import backups
from tests.conftest import TestBroker
from tests.integration.rmproc import RMProcess
from tests.security.rmstate import gpurm, known_node, run_rm


def submitted_rm(tmp_path: Path, broker: TestBroker) -> RMProcess:
    """A stopped RM whose store holds a node and one job (job-1), and whose backups hold the same."""
    rm = RMProcess(tmp_path, broker)
    known_node(tmp_path, rm)
    rm.submit("true")
    rm.stop()
    rm.start()         # a backup at start: it holds the job
    rm.stop()
    return rm


def edit_job(state_dir: Path, change: Callable[[dict[str, object]], None]) -> None:
    with sqlite3.connect(state_dir / "state.db") as db:
        data = json.loads(db.execute("SELECT data FROM jobs WHERE job_id='job-1'").fetchone()[0])
        change(data)
        db.execute("UPDATE jobs SET data=? WHERE job_id='job-1'", (json.dumps(data),))
    db.close()


def refused_start(rm: RMProcess) -> str:
    """Start the RM on its damaged store: it must exit 2 with one error line and no traceback."""
    done = run_rm(rm.config)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, done.stderr
    assert f"gpurm admin store check --state-dir {rm.state_dir}" in errors[0]
    assert "gpurm admin store restore" in errors[0]
    return errors[0]


def set_state(data: dict[str, object]) -> None:
    data["state"] = "HIBERNATING"


def drop_user(data: dict[str, object]) -> None:
    del data["user"]


@pytest.mark.parametrize(("damage", "expected"), [
    (set_state, "state: unknown JobState value 'HIBERNATING'"),
    (drop_user, "user: missing"),
])
def test_a_bad_record_is_named_and_a_backup_restores_the_store(
        tmp_path: Path, broker: TestBroker, damage: Callable[[dict[str, object]], None], expected: str) -> None:
    rm = submitted_rm(tmp_path, broker)
    try:
        edit_job(rm.state_dir, damage)
        line = refused_start(rm)
        assert f"jobs job-1: {expected}" in line, line

        check = gpurm("admin", "store", "check", "--state-dir", str(rm.state_dir))
        assert check.returncode == 1, check.stdout + check.stderr
        assert f"DAMAGED jobs job-1: {expected}" in check.stdout

        (newest, *_) = reversed(backups(rm.state_dir))
        assert gpurm("admin", "store", "check", "--state-dir", str(rm.state_dir), "-o", "json").returncode == 1
        done = gpurm("admin", "store", "restore", "--state-dir", str(rm.state_dir), str(newest))
        assert done.returncode == 0, done.stderr
        assert gpurm("admin", "store", "check", "--state-dir", str(rm.state_dir)).returncode == 0
        kept = list(rm.state_dir.glob("state.db.replaced-*"))
        assert kept, "the damaged store is kept beside the restored one"

        rm.start()
        assert rm.job("job-1").user
    finally:
        rm.close()


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_a_damaged_file_gives_one_line_at_start(tmp_path: Path, broker: TestBroker, how: str) -> None:
    rm = submitted_rm(tmp_path, broker)
    try:
        store = rm.state_dir / "state.db"
        if how == "garbage":
            store.write_bytes(b"this is not an SQLite file" * 200)
        else:
            with store.open("r+b") as f:
                f.truncate(store.stat().st_size // 2)
        line = refused_start(rm)
        assert f"the RM's store {store}" in line and "cannot be read" in line, line
        check = gpurm("admin", "store", "check", "--state-dir", str(rm.state_dir))
        assert check.returncode == 1 and "DAMAGED" in check.stdout, check.stdout + check.stderr
    finally:
        rm.close()


def test_restore_refuses_while_an_rm_holds_the_state_dir_and_backup_works_online(tmp_path: Path,
                                                                                   broker: TestBroker) -> None:
    rm = RMProcess(tmp_path, broker)
    try:
        copy = tmp_path / "copy.db"
        done = gpurm("admin", "store", "backup", "--state-dir", str(rm.state_dir), "--to", str(copy))
        assert done.returncode == 0 and copy.is_file(), done.stderr
        before = (rm.state_dir / "state.db").stat().st_ino
        refused = gpurm("admin", "store", "restore", "--state-dir", str(rm.state_dir), str(copy))
        assert rm.proc is not None
        assert refused.returncode == 2 and f"pid {rm.proc.pid}" in refused.stderr, refused.stderr
        assert (rm.state_dir / "state.db").stat().st_ino == before, "a refused restore changes nothing"
        again = gpurm("admin", "store", "backup", "--state-dir", str(rm.state_dir), "--to", str(copy))
        assert again.returncode == 2 and "exists" in again.stderr
    finally:
        rm.close()


def test_check_without_a_store_is_bad_input(tmp_path: Path) -> None:
    done = gpurm("admin", "store", "check", "--state-dir", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "holds no RM store" in done.stderr
    assert not (tmp_path / "nothing").exists(), "check creates nothing"


