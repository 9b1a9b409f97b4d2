"""Fixtures shared by the whole suite: free loopback ports and a real MQTT broker."""

from __future__ import annotations

import shutil
import socket
import subprocess
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


@pytest.fixture(scope="session")
def mqtt_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real broker for the session: mosquitto where the binary exists, else the embedded amqtt broker.

    Never the machine's own mosquitto on 1883: tests start their own on a free port.
    """
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    p = free_port()
    workdir = tmp_path_factory.mktemp("mosquitto")
    if binary:
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {p} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=open(workdir / "mosquitto.log", "wb"))  # noqa: SIM115
    else:
        import sys

        code = (
            "import asyncio,sys\n"
            "from gpurm.rm.broker import EmbeddedBroker\n"
            "async def main():\n"
            f"    b = EmbeddedBroker('127.0.0.1', {p}); await b.start(); await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                stderr=open(workdir / "amqtt.log", "wb"))  # noqa: SIM115
    try:
        wait_port(p)
        yield f"mqtt://127.0.0.1:{p}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
