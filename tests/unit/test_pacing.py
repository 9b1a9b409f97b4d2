"""rm/sched/pacing.py: a running AM's wait between Allocate calls grows with the number of AMs, within bounds; and
rm.yaml `am.max_allocate_rate`. Pure; files only for the config."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.sched.pacing import steady_allocate_interval


def test_a_small_cluster_keeps_four_times_the_interval() -> None:
    assert steady_allocate_interval(0.5, 10, 500.0, 60.0) == 2.0
    assert steady_allocate_interval(0.5, 1000, 500.0, 60.0) == 2.0      # exactly the rate


def test_many_ams_are_spread_over_the_rate() -> None:
    assert steady_allocate_interval(0.5, 2500, 500.0, 60.0) == 5.0
    # The calls a second of all running AMs together stay at the rate.
    ams = 4000
    assert ams / steady_allocate_interval(0.5, ams, 500.0, 60.0) == pytest.approx(500.0)


def test_the_wait_never_reaches_the_liveness_timeout() -> None:
    # 100,000 AMs would need 200 s each; a quarter of the liveness timeout is the most.
    assert steady_allocate_interval(0.5, 100_000, 500.0, 60.0) == 15.0
    # ... but never below the plain steady interval, even with a tiny liveness timeout.
    assert steady_allocate_interval(0.5, 100_000, 500.0, 4.0) == 2.0


def test_the_rate_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "rm.yaml"
    path.write_text("am: {max_allocate_rate: 2000}\n")
    assert load_rm_config(path).settings.max_allocate_rate == 2000.0
    path.write_text("am: {max_allocate_rate: 0}\n")
    with pytest.raises(ConfigError, match="max_allocate_rate"):
        load_rm_config(path)
    shipped = Path(__file__).resolve().parents[2] / "configs" / "rm.yaml"
    assert load_rm_config(shipped).settings.max_allocate_rate == 500.0
