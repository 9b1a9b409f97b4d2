"""SIGTERM could hang the RM. Now a stop is bounded (rm.yaml `shutdown: {grace, timeout}`): in-flight requests
get `grace`, and the RM exits `timeout` after the signal whatever still hangs, saying so in its log. Real RM,
real broker, a client holding a stuck heartbeat stream and a request in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import run_broker
from tests.integration.rmproc import RMProcess

GRACE_S = 1.0
TIMEOUT_S = 3.0


def stuck_stream(release: threading.Event) -> Iterator[pb.NodeHeartbeat]:
    """A heartbeat stream that never sends a beat (and whose replies are never read) until `release`."""
    release.wait()
    yield from ()


def stop_time(rm: RMProcess) -> float:
    assert rm.proc is not None
    t0 = time.monotonic()
    rm.proc.send_signal(signal.SIGTERM)
    try:
        rm.proc.wait(TIMEOUT_S + 5)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the RM still runs {TIMEOUT_S + 5:g}s after SIGTERM:\n{rm.log_text()[-3000:]}")
    return time.monotonic() - t0


def test_sigterm_stops_the_rm_within_the_bound_despite_a_stuck_stream_and_a_frozen_broker(
        tmp_path: Path) -> None:
    release = threading.Event()
    with run_broker(tmp_path / "broker") as url:
        rm = RMProcess(tmp_path, url, shutdown={"grace": f"{GRACE_S}s", "timeout": f"{TIMEOUT_S}s"})
        broker_pid = int(next(line.split()[0] for line in subprocess.run(
            ["pgrep", "-a", "-f", str(tmp_path / "broker")], capture_output=True, text=True, check=False
        ).stdout.splitlines() if "mosquitto" in line or "EmbeddedBroker" in line))
        tracker = pbg.ResourceTrackerStub(rm.channel)
        stream = tracker.Heartbeat(stuck_stream(release), timeout=60)
        try:
            os.kill(broker_pid, signal.SIGSTOP)     # a dependency that stops answering
            took = stop_time(rm)
        finally:
            os.kill(broker_pid, signal.SIGCONT)
            release.set()
            stream.cancel()
            rm.channel.close()
        assert took < TIMEOUT_S + 1.5, f"stopped after {took:.1f}s"
        log = rm.log_text()
        assert "SIGTERM: stopping (in-flight requests get 1.0 s; exit within 3.0 s)" in log
        assert (rm.proc.returncode, "RM stopped" in log or "exiting now" in log) in ((0, True), (1, True)), log


def test_the_watchdog_ends_a_process_whose_loop_is_blocked() -> None:
    """What bounds a stop when something hangs: the watchdog's thread fires even while the main thread (the
    event loop) is stuck, logs why and exits 1."""
    code = ("import logging, time\n"
            "logging.basicConfig()\n"
            "from gpurm.rm.server.process import ShutdownWatchdog\n"
            "ShutdownWatchdog(0.5).arm('SIGTERM')\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    took = time.monotonic() - t0
    assert done.returncode == 1, done.stderr
    assert "RM did not stop within 0.5 s of SIGTERM (shutdown.timeout); exiting now" in done.stderr
    assert took < 20, f"took {took:.1f}s"
