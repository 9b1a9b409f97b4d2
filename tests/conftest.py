"""Fixtures shared by the whole suite: free loopback ports and a real MQTT broker."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PHILLY = Path(__file__).resolve().parent / "data" / "philly"    # the Philly trace, vendored (CC BY 4.0)


def philly_data(name: str) -> Path:
    """A file of the vendored Philly data set (tests/data/philly/)."""
    return PHILLY / name


def free_port() -> int:
    """A port nobody listens on right now (bind to 0, read it back, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture
def port() -> int:
    return free_port()


@contextlib.contextmanager
def run_broker(workdir: Path) -> Iterator[str]:
    """A real broker on a free port until the block ends: mosquitto where the binary exists, else the embedded
    amqtt broker. Never the machine's own mosquitto on 1883."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    if binary:
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        argv = [binary, "-c", str(conf)]
    else:
        argv = [sys.executable, "-c", "import asyncio\nfrom gpurm.rm.broker import EmbeddedBroker\n"
                "async def main():\n"
                f"    b = EmbeddedBroker('127.0.0.1', {port}); await b.start(); await asyncio.Event().wait()\n"
                "asyncio.run(main())\n"]
    with (workdir / "broker.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_port(port)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def mqtt_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real broker for the session (see run_broker)."""
    with run_broker(tmp_path_factory.mktemp("broker")) as url:
        yield url
