"""rm.yaml `preemption:`: in-queue preemption for las / srtf leaves and the las levels. Files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S


def rm_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(text)
    return path


def test_in_queue_preemption_is_on_by_default(tmp_path: Path) -> None:
    s = load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).settings
    assert s.inqueue_preemption is True
    assert s.inqueue_min_run_s == 300.0
    assert s.las_thresholds_gpu_s == LAS_THRESHOLDS_GPU_S


def test_the_preemption_section_is_read(tmp_path: Path) -> None:
    s = load_rm_config(rm_yaml(tmp_path, "preemption: {in_queue: false, in_queue_min_run: 20s, "
                                         "las_thresholds: [2m, 1h]}\n")).settings
    assert (s.inqueue_preemption, s.inqueue_min_run_s, s.las_thresholds_gpu_s) == (False, 20.0, (120.0, 3600.0))


def test_the_shipped_rm_yaml_states_the_defaults() -> None:
    s = load_rm_config(Path(__file__).resolve().parents[2] / "configs" / "rm.yaml").settings
    assert (s.inqueue_preemption, s.inqueue_min_run_s, s.las_thresholds_gpu_s) == (True, 300.0, LAS_THRESHOLDS_GPU_S)
    assert s.elastic_regrow_hold_s == 60.0


@pytest.mark.parametrize(("value", "problem"), [
    ("[1h, 30m]", "rising"), ("[]", "list of GPU-times"), ("[1h, soon]", "las_thresholds"), ("1h", "list"),
])
def test_bad_las_thresholds_are_named(tmp_path: Path, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, f"preemption: {{las_thresholds: {value}}}\n"))
    assert "preemption.las_thresholds" in str(err.value) and problem in str(err.value)


def test_an_unknown_preemption_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"preemption\.in_queue_min"):
        load_rm_config(rm_yaml(tmp_path, "preemption: {in_queue_min: 5m}\n"))


def test_the_elastic_regrow_hold_is_read_and_reaches_the_core(tmp_path: Path) -> None:
    from gpurm.rm.state.core import RMCore
    assert load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).settings.elastic_regrow_hold_s == 60.0
    s = load_rm_config(rm_yaml(tmp_path, "elastic: {regrow_hold: 5s}\n")).settings
    assert s.elastic_regrow_hold_s == 5.0
    book = RMCore(s).elastic
    book.shrunk_at["j"] = 100.0
    assert not book.may_grow("j", 104.0) and book.may_grow("j", 105.0)
    with pytest.raises(ConfigError, match="regrow_hold"):
        load_rm_config(rm_yaml(tmp_path, "elastic: {regrow_hold: soon}\n"))
