"""The chaos test: 50 jobs of 1-16 GPUs on 4 agents while the RM is SIGKILLed twice, one agent once and one AM
once, each restarted. See tests/integration/chaos.py for the checks; `scripts/chaos --jobs N` runs longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TestBroker
from tests.integration.chaos import Chaos

# 50 AMs, RM and agent restarts: on the one worker that runs such modules one at a time (tests/parallel.py)
pytestmark = pytest.mark.whole_machine


def test_chaos(tmp_path: Path, broker: TestBroker) -> None:
    events: list[str] = []
    # Jobs of 1-4 s (scripts/chaos: 2-8 s): the faults all come within the first seconds, while jobs run (the run
    # waits for running jobs before each); longer jobs only made the queue behind them longer.
    report = Chaos(tmp_path, broker, jobs=50, seed=0, say=events.append, sleep_s=(1.0, 4.0)).run(timeout=300)
    assert len(report.chaos_events) == 4, report.chaos_events
    assert sum(report.by_state.values()) == 50
    assert report.ok, "\n".join([*report.problems, report.line(), *events])
