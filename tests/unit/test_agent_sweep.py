"""The agent's sweep of ended containers' dirs (nodeagent/sweep.py, agent.yaml containers.keep_finished)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.nodeagent.config import ConfigError, load_agent_config
from gpurm.nodeagent.records import LOG_FILE, RECORD_FILE, ContainerRecord, write_json_atomic
from gpurm.nodeagent.sweep import NEVER, sweep_ended, sweep_interval
from gpurm.proto import gpurm_pb2 as pb

DAY = 86400.0
NOW = 1_800_000_000.0


def container(root: Path, cid: str, state: pb.ContainerState, end: float) -> Path:
    cdir = root / cid
    cdir.mkdir(parents=True)
    rec = ContainerRecord(cid, "job-1", pb.CONTAINER_LEARNER, state, [0], end_ms=int(end * 1000) if end else 0)
    write_json_atomic(cdir / RECORD_FILE, rec.to_json())
    (cdir / LOG_FILE).write_bytes(b"epoch 1 loss 0.3\n")
    return cdir


def test_only_dirs_of_containers_ended_long_ago_and_no_longer_tracked_are_removed(tmp_path: Path) -> None:
    old = container(tmp_path, "c-old", pb.CONTAINER_EXITED, NOW - 8 * DAY)
    recent = container(tmp_path, "c-recent", pb.CONTAINER_EXITED, NOW - 6 * DAY)
    live = container(tmp_path, "c-live", pb.CONTAINER_RUNNING, 0.0)
    unacked = container(tmp_path, "c-unacked", pb.CONTAINER_FAILED_TO_START, NOW - 30 * DAY)
    broken = tmp_path / "c-broken"               # no readable record: kept, whatever its age
    broken.mkdir()
    (broken / RECORD_FILE).write_text("{not json")
    (tmp_path / "c-link").symlink_to(old)        # never followed
    gone = sweep_ended(tmp_path, 7 * DAY, NOW, tracked={"c-unacked"})
    assert gone == ["c-old"]
    assert not old.exists()
    assert recent.exists() and live.exists() and unacked.exists() and broken.exists()
    assert sweep_ended(tmp_path, NEVER, NOW + 100 * DAY, tracked=set()) == []
    assert sweep_ended(tmp_path / "missing", DAY, NOW, tracked=set()) == []


def test_a_live_container_is_never_removed_however_old(tmp_path: Path) -> None:
    live = container(tmp_path, "c-live", pb.CONTAINER_RUNNING, NOW - 400 * DAY)   # a stale end_ms, still running
    assert sweep_ended(tmp_path, 3600.0, NOW, tracked=set()) == [] and live.exists()


def test_a_pass_removes_at_most_its_limit(tmp_path: Path) -> None:
    for k in range(5):
        container(tmp_path, f"c{k}", pb.CONTAINER_EXITED, NOW - 10 * DAY)
    assert len(sweep_ended(tmp_path, DAY, NOW, tracked=set(), limit=3)) == 3
    assert len(sweep_ended(tmp_path, DAY, NOW, tracked=set(), limit=3)) == 2
    assert sweep_interval(7 * DAY) == 3600.0 and sweep_interval(3600.0) == 360.0


def test_keep_finished_is_read_from_agent_yaml() -> None:
    fake = {"gpus": {"fake": 1}}
    assert load_agent_config(None, fake, environ={}).containers.keep_finished_s == 7 * DAY
    cfg = load_agent_config(None, {**fake, "containers": {"keep_finished": "2d"}}, environ={})
    assert cfg.containers.keep_finished_s == 2 * DAY
    never = load_agent_config(None, {**fake, "containers": {"keep_finished": "never"}}, environ={})
    assert never.containers.keep_finished_s == NEVER
    with pytest.raises(ConfigError, match=r"containers\.keep_finished"):
        load_agent_config(None, {**fake, "containers": {"keep_finished": "5m"}}, environ={})
