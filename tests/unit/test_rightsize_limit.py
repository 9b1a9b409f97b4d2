"""`rightsize: on`: the memory.high the agent writes per phase (rightsize/limit.py, AgentMonitor.apply_rightsize)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpurm.nodeagent.config import load_agent_config
from gpurm.nodeagent.monitor import AgentMonitor
from gpurm.rightsize.limit import FLOOR_MIB, MARGIN, ceiling_mib, phase_limit_mib
from gpurm.rightsize.phases import discover
from gpurm.rightsize.series import Sample


def levels(*plan: tuple[float, int]) -> list[Sample]:
    out: list[Sample] = []
    for mem, count in plan:
        out.extend(Sample(t=15.0 * len(out), cpu=1.0, mem_mib=mem, gpu=None) for _ in range(count))
    return out


def test_the_limit_follows_the_current_phase_with_a_margin_and_a_floor() -> None:
    samples = levels((1000.0, 10), (4000.0, 10), (1000.0, 10))
    model = discover(samples)
    assert phase_limit_mib(model, 1000.0) == pytest.approx(1000 * (1 + MARGIN))
    in_training = discover(samples[:20])
    assert phase_limit_mib(in_training, 4000.0) == pytest.approx(4000 * (1 + MARGIN))
    assert phase_limit_mib(model, 3000.0) == pytest.approx(3000 * (1 + MARGIN))   # never below the use now
    assert ceiling_mib(model, 1000.0) == pytest.approx(4000 * (1 + MARGIN))
    assert phase_limit_mib(discover(levels((10.0, 5))), 10.0) == FLOOR_MIB
    assert phase_limit_mib(discover([]), 10.0) is None


class Supervisor:
    def __init__(self, cgroup: str, controllers: frozenset[str], warning: str = "") -> None:
        self.rec = SimpleNamespace(container_id="j1-c1", job_id="j1", cgroup=cgroup, rightsize=True)
        self.cgroups = SimpleNamespace(controllers=controllers, warning=warning)

    def record(self, cid: str) -> Any:
        return self.rec if cid == "j1-c1" else None


def monitor(sup: Supervisor) -> AgentMonitor:
    cfg = load_agent_config(None, {"gpus": {"fake": 1}}, environ={})
    return AgentMonitor(cfg, cast(Any, None), [], cast(Any, sup))


def test_memory_high_is_written_where_cgroup_v2_memory_control_exists(tmp_path: Path) -> None:
    (tmp_path / "memory.high").write_text("max\n")
    m = monitor(Supervisor(str(tmp_path), frozenset({"cpu", "memory"})))
    m.apply_rightsize("j1-c1", 1250.0, "phase 1 of 2")
    assert (tmp_path / "memory.high").read_text() == str(1250 * 1024 * 1024)
    (tmp_path / "memory.high").write_text("untouched")
    m.apply_rightsize("j1-c1", 1260.0, "phase 1 of 2")                   # within 5%: left alone
    assert (tmp_path / "memory.high").read_text() == "untouched"
    m.apply_rightsize("j1-c1", 5000.0, "phase 2 of 2")
    assert (tmp_path / "memory.high").read_text() == str(5000 * 1024 * 1024)
    assert m.memory_high == {"j1-c1": 5000.0}


def test_without_memory_control_it_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    m = monitor(Supervisor("", frozenset(), "cgroup v2 is not mounted: containers run without limits"))
    with caplog.at_level(logging.WARNING):
        m.apply_rightsize("j1-c1", 1250.0, "phase 1 of 2")
        m.apply_rightsize("j1-c1", 5000.0, "phase 2 of 2")
    warnings = [r.getMessage() for r in caplog.records if "rightsize: on" in r.getMessage()]
    assert warnings == ["container j1-c1 (job j1): its queue has rightsize: on, but cgroup v2 is not mounted: "
                        "containers run without limits: its phases are reported, its memory is not limited"]
    assert m.memory_high == {}
