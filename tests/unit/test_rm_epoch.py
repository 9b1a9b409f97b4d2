"""The RM's epoch (rm/server/startup.py bump_epoch): +1 per start of one state dir; a new state dir starts from a
random one, so two RMs sharing a broker never publish views of one epoch (an AM compares versions within one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.server.startup import FRESH_EPOCHS, bump_epoch


def test_each_start_of_one_state_dir_is_one_epoch_more(tmp_path: Path) -> None:
    first = bump_epoch(tmp_path / "epoch")
    assert 0 < first <= FRESH_EPOCHS
    assert bump_epoch(tmp_path / "epoch") == first + 1
    assert (tmp_path / "epoch").read_text().strip() == str(first + 1)


def test_new_state_dirs_start_at_different_epochs(tmp_path: Path) -> None:
    # Two clusters on one broker (the suite's shared broker, two teams' clusters): each AM must see its own RM's
    # views as another run than the other's. Ten fresh dirs, ten epochs (a repeat has odds of about 2^-34).
    epochs = set()
    for k in range(10):
        (tmp_path / f"rm{k}").mkdir()
        epochs.add(bump_epoch(tmp_path / f"rm{k}" / "epoch"))
    assert len(epochs) == 10


def test_a_damaged_epoch_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("not a number")
    with pytest.raises(ConfigError, match="not an epoch number"):
        bump_epoch(tmp_path / "epoch")
