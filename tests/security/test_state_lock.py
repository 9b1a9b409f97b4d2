"""Two RMs could run on one state directory. Now the first holds an exclusive lock on it for its whole life: a
second RM exits 2 with one line naming the directory and the holder's pid, and the state is private (0700/0600)."""

from __future__ import annotations

import stat
from pathlib import Path

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.rmproc import RMProcess
from tests.security.rmstate import rm_config, run_rm


def test_a_second_rm_on_the_same_state_dir_exits_2_naming_the_dir_and_the_holder(tmp_path: Path,
                                                                                   broker: TestBroker) -> None:
    first = RMProcess(tmp_path / "first", broker)
    try:
        assert first.proc is not None
        second = run_rm(rm_config(tmp_path / "second", first.state_dir, broker))
        assert second.returncode == 2, second.stderr
        errors = [line for line in second.stderr.splitlines() if "ERROR" in line]
        assert len(errors) == 1, second.stderr
        assert str(first.state_dir) in errors[0] and f"pid {first.proc.pid}" in errors[0], errors[0]
        assert "Traceback" not in second.stderr
        first.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10)   # the first one serves on

        first.kill()                  # SIGKILL: the kernel drops the lock with the process
        first.start()
    finally:
        first.close()


def test_the_state_dir_is_private(tmp_path: Path, broker: TestBroker) -> None:
    rm = RMProcess(tmp_path, broker)
    try:
        assert stat.S_IMODE(rm.state_dir.stat().st_mode) == 0o700
        files = [p for p in rm.state_dir.rglob("*") if p.is_file()]
        assert {"state.db", "token.key", "rm.lock", "rm.json"} <= {p.name for p in files}
        loose = {str(p.relative_to(rm.state_dir)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
                 if stat.S_IMODE(p.stat().st_mode) & 0o077}
        assert not loose, f"readable by others: {loose}"
    finally:
        rm.close()


def test_an_older_state_dir_is_made_private_at_start(tmp_path: Path, broker: TestBroker) -> None:
    rm = RMProcess(tmp_path, broker)
    rm.stop()
    rm.state_dir.chmod(0o755)
    (rm.state_dir / "state.db").chmod(0o644)
    try:
        rm.start()
        assert stat.S_IMODE(rm.state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((rm.state_dir / "state.db").stat().st_mode) == 0o600
    finally:
        rm.close()
