"""The RM's forecast worker process (rm/forecast/worker.py) does not outlive its RM: killed with SIGKILL, the RM
cannot stop it, and a pool worker never sees its queue close (it holds both ends), so it watches its parent and
exits once the RM is gone. Before, every RM killed while forecasting left a process behind for good."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from tests.conftest import TestBroker
from tests.integration.harness import alive
from tests.integration.rmproc import AgentProcess, RMProcess, poll, wait_gone


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def forecast_worker(rm_pid: int) -> int | None:
    for pid in children(rm_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing" in cmdline and b"spawn_main" in cmdline and b"tracker_fd" in cmdline:
            return pid
    return None


def test_the_forecast_worker_ends_when_its_rm_is_killed(tmp_path: Path, broker: TestBroker) -> None:
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="1s", forecast={"interval": "1s"})
    agent = AgentProcess(tmp_path / "agent", rm, f"fcw-{uuid.uuid4().hex[:6]}", gpus={"fake": 1})
    try:
        agent.start()
        rm.submit("sleep 300", gpus=1)
        rm.submit("sleep 300", gpus=1)                  # waits: a round forecasts it, in the worker process
        assert rm.proc is not None
        worker = poll(lambda: forecast_worker(rm.proc.pid), 60, lambda: f"no forecast worker:\n{rm.log_text()}")
        rm.kill()
        wait_gone([worker], timeout=15)
        assert not alive(worker)
    finally:
        agent.close()
        rm.close()
