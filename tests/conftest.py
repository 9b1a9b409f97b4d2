"""Fixtures shared by the whole suite: free loopback ports and a real MQTT broker with credentials."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpurm.rm.brokerauth import SECRET_FILE, BrokerAuth, load_or_create, write_mosquitto_files

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


@dataclass(frozen=True)
class TestBroker:
    """A running broker that refuses anonymous clients, and the logins it knows (brokerauth.py)."""

    __test__ = False  # not a test class

    url: str
    kind: str                     # "mosquitto" or "amqtt"
    auth: BrokerAuth
    rm_password_file: Path
    reader_password_file: Path

    def rm_config(self) -> dict[str, str]:
        """rm.yaml's `mqtt` section for an RM using this broker with these logins."""
        return {"url": self.url, "username": self.auth.rm.username, "password_file": str(self.rm_password_file),
                "reader_username": self.auth.reader.username,
                "reader_password_file": str(self.reader_password_file)}

    def dev_cluster_args(self) -> list[str]:
        """`gpurm dev-cluster` arguments for an RM using this broker with these logins."""
        args = ["--mqtt-url", self.url]
        for key, value in self.rm_config().items():
            if key != "url":
                args += ["--rm-option", f"mqtt.{key}={value}"]
        return args


def _password_file(path: Path, password: str) -> Path:
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def run_broker(workdir: Path, kind: str = "") -> Iterator[TestBroker]:
    """A real broker with credentials on a free port until the block ends: mosquitto where the binary exists
    (with the files `gpurm admin broker-files` writes), else the embedded amqtt broker; `kind` picks one. Never
    the machine's own mosquitto on 1883."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    kind = kind or ("mosquitto" if binary else "amqtt")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    auth = load_or_create(workdir)
    if kind == "mosquitto":
        if binary is None:
            pytest.skip("no mosquitto binary here")
        files = write_mosquitto_files(auth, workdir / "mosquitto", "127.0.0.1", port)
        conf = workdir / "mosquitto.conf"
        # Tests run as root: stay root, so mosquitto can read files under the tests' private temp dirs.
        conf.write_text(f"user {pwd.getpwuid(os.geteuid()).pw_name}\npersistence false\n{files.conf.read_text()}")
        argv = [binary, "-c", str(conf)]
    else:
        argv = [sys.executable, "-c", "import asyncio\nfrom pathlib import Path\n"
                "from gpurm.rm.broker import EmbeddedBroker\nfrom gpurm.rm.brokerauth import load\n"
                "async def main():\n"
                f"    b = EmbeddedBroker('127.0.0.1', {port}, load(Path({str(workdir / SECRET_FILE)!r})))\n"
                "    await b.start(); await asyncio.Event().wait()\n"
                "asyncio.run(main())\n"]
    with (workdir / "broker.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_port(port)
        yield TestBroker(f"mqtt://127.0.0.1:{port}", kind, auth,
                         _password_file(workdir / "rm.password", auth.rm.password),
                         _password_file(workdir / "reader.password", auth.reader.password))
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """A real broker with credentials for the session (see run_broker)."""
    with run_broker(tmp_path_factory.mktemp("broker")) as b:
        yield b
