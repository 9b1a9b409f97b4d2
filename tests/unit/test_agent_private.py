"""The agent's safe file helpers (nodeagent/private.py) and the modes of what it writes: no sockets, no sleeps."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpurm.nodeagent.logfiles import LogWriter, append_private, read_range
from gpurm.nodeagent.private import (
    PRIVATE_DIR_MODE,
    TRAVERSE_DIR_MODE,
    UnsafePathError,
    make_dir,
    open_read,
    state_dir_mode,
    write_private,
)
from gpurm.nodeagent.records import read_record, write_json_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_make_dir_sets_the_mode_and_refuses_a_symlink(tmp_path: Path) -> None:
    make_dir(tmp_path / "a" / "b", TRAVERSE_DIR_MODE)
    assert mode(tmp_path / "a" / "b") == 0o711
    (tmp_path / "a" / "b").chmod(0o755)
    make_dir(tmp_path / "a" / "b", PRIVATE_DIR_MODE)           # an existing dir gets the mode asked for
    assert mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "a").chmod(0o755)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(UnsafePathError, match="not a folder"):
        make_dir(tmp_path / "link", PRIVATE_DIR_MODE)
    assert mode(tmp_path / "a") == 0o755                        # the link's target is left alone


def test_the_state_dir_is_traversable_only_for_a_root_agent() -> None:
    assert (state_dir_mode(0), state_dir_mode(1000)) == (0o711, 0o700)


def test_write_private_makes_a_new_0600_file_and_never_follows_a_link(tmp_path: Path) -> None:
    write_private(tmp_path / "f", b"data")
    assert (mode(tmp_path / "f"), (tmp_path / "f").read_bytes()) == (0o600, b"data")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "planted").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "planted", b"overwritten?")
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "f", b"again")
    assert victim.read_text() == "keep"


def test_reads_and_appends_refuse_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only")
    (tmp_path / "link").symlink_to(secret)
    with pytest.raises(OSError):
        open_read(tmp_path / "link")
    with pytest.raises(OSError):
        append_private(tmp_path / "link", b"x")
    assert secret.read_text() == "root only"
    os.mkfifo(tmp_path / "fifo")   # would block a plain open until someone reads or writes its other end
    with pytest.raises(OSError):
        append_private(tmp_path / "fifo", b"x")
    with pytest.raises(UnsafePathError, match="not a plain file"):
        open_read(tmp_path / "fifo")


def test_a_record_is_0600_written_past_a_planted_temp_link_and_a_forged_one_is_ignored(tmp_path: Path) -> None:
    cdir = tmp_path / "c-1"
    cdir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (cdir / ".record.json.tmp").symlink_to(victim)
    data = {"container_id": "c-1", "job_id": "j", "kind": "CONTAINER_LEARNER", "state": "CONTAINER_RUNNING",
            "gpu_indices": []}
    write_json_atomic(cdir / "record.json", data)
    assert victim.read_text() == "keep"
    assert mode(cdir / "record.json") == 0o600 and not (cdir / "record.json").is_symlink()
    rec = read_record(cdir)
    assert rec is not None and rec.container_id == "c-1"
    # a record naming another container (moved here by the dir's owner) is not believed
    (tmp_path / "c-2").mkdir()
    os.replace(cdir / "record.json", tmp_path / "c-2" / "record.json")
    assert read_record(tmp_path / "c-2") is None
    # nor a link to one
    (cdir / "record.json").symlink_to(tmp_path / "c-2" / "record.json")
    assert read_record(cdir) is None
    assert json.loads((tmp_path / "c-2" / "record.json").read_text())["container_id"] == "c-1"


def test_log_files_are_0600_and_a_swapped_log_reads_as_empty(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_size=8, keep=2)
    writer.write(b"0123456789")   # rotates
    writer.write(b"abc")
    writer.close()
    for name in ("output.log", "output.log.1", "output.log.index"):
        assert mode(tmp_path / name) == 0o600, name
    assert read_range(tmp_path, 0, 100).data == b"0123456789abc"
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("root only")
    (tmp_path / "output.log").unlink()
    (tmp_path / "output.log").symlink_to(secret)
    assert b"root only" not in read_range(tmp_path, 0, 100).data
