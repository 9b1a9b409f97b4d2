"""Fixtures shared by the whole suite: free loopback ports, a real MQTT broker with credentials, temp dirs a
job can reach."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpurm.rm.security.brokerauth import SECRET_FILE, BrokerAuth, load_or_create, write_mosquitto_files

if TYPE_CHECKING:
    from tests.pg import PgServer

pytest_plugins = ("tests.parallel",)   # pytest-xdist: worker count and groups (tests/parallel.py)

PHILLY = Path(__file__).resolve().parent / "data" / "philly"    # the Philly trace, vendored (CC BY 4.0)


def philly_data(name: str) -> Path:
    """A file of the vendored Philly data set (tests/data/philly/)."""
    return PHILLY / name


# An agent run as root (tests run as root in CI) runs every job as `nobody`, who must reach its container dir
# below the test's temp dir: pytest's own /tmp/pytest-of-root is 0700. So the suite's temp dirs live under
# /tmp/gpurm-tests-<uid>/run-XXXX (one per session, so parallel sessions never clear each other's), and each
# level down to every test's dir is 0711: traversable, never listable. What a test makes inside stays its own.
TRAVERSE = 0o711
KEEP_RUNS_S = 24 * 3600
_RUN_DIR = pytest.StashKey[Path]()


def _suite_base() -> Path:
    base = Path(tempfile.gettempdir()) / f"gpurm-tests-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=TRAVERSE)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise pytest.UsageError(f"{base} is not a folder of this user: remove it")
    os.chmod(base, TRAVERSE)
    now = time.time()
    for old in base.glob("run-*"):  # earlier sessions' leftovers
        with contextlib.suppress(OSError):
            if now - old.lstat().st_mtime > KEEP_RUNS_S:
                shutil.rmtree(old, ignore_errors=True)
    return base


def pytest_configure(config: pytest.Config) -> None:
    from gpurm import native
    if native.status().stale:   # compiled code that is no longer the tree's would be what the suite tests
        raise pytest.UsageError(f"{native.status().reason.split('; ')[1]}")
    if config.option.basetemp is None:
        run = Path(tempfile.mkdtemp(prefix="run-", dir=_suite_base()))
        os.chmod(run, TRAVERSE)
        config.option.basetemp = str(run)
        config.stash[_RUN_DIR] = run


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist's controller) Asking for the run dir to name each worker's (run-XXXX/popen-gwN), xdist had
    pytest remake it 0700: traversable again, or no job (as nobody) reaches its container dir."""
    os.chmod(node.config._tmp_path_factory.getbasetemp(), TRAVERSE)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that passed leaves nothing behind; a failed one keeps its dirs (a day) for a look."""
    run = session.config.stash.get(_RUN_DIR, None)
    if run is not None and exitstatus == 0:
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's tmp_path, traversable (0711) so that a job running as another user reaches dirs inside."""
    os.chmod(tmp_path, TRAVERSE)
    return tmp_path


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> pytest.TempPathFactory:
    """pytest's factory whose base and mktemp dirs are traversable (0711), as tmp_path's."""
    os.chmod(tmp_path_factory.getbasetemp(), TRAVERSE)  # pytest (re)makes it 0700
    return _Traversable(tmp_path_factory)  # type: ignore[return-value]


class _Traversable:
    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory

    def mktemp(self, basename: str, numbered: bool = True) -> Path:
        path = self._factory.mktemp(basename, numbered)
        os.chmod(path, TRAVERSE)
        return path

    def __getattr__(self, name: str) -> object:  # everything else (pytest's tmp_path uses private parts)
        return getattr(self._factory, name)


def job_user_dir(path: Path) -> Path:
    """A folder the jobs of the tests' agents may write (results a test reads back): they run as `nobody` when
    the tests run as root, else as the tests' own user."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    os.chmod(path, 0o700)
    return path


def free_port() -> int:
    """A port nobody listens on right now (bind to 0, read it back, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


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
def run_broker(workdir: Path, kind: str = "", host: str = "127.0.0.1") -> Iterator[TestBroker]:
    """A real broker with credentials on a free port until the block ends: mosquitto where the binary exists
    (with the files `gpurm admin broker-files` writes), else the embedded amqtt broker; `kind` picks one. Never
    the machine's own mosquitto on 1883. `host`: the address it listens on (a bridge's, for network namespaces)."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    kind = kind or ("mosquitto" if binary else "amqtt")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    auth = load_or_create(workdir)
    if kind == "mosquitto":
        if binary is None:
            pytest.skip("no mosquitto binary here")
        files = write_mosquitto_files(auth, workdir / "mosquitto", host, port)
        conf = workdir / "mosquitto.conf"
        # Tests run as root: stay root, so mosquitto can read files under the tests' private temp dirs.
        conf.write_text(f"user {pwd.getpwuid(os.geteuid()).pw_name}\npersistence false\n{files.conf.read_text()}")
        argv = [binary, "-c", str(conf)]
    else:
        argv = [sys.executable, "-c", "import asyncio\nfrom pathlib import Path\n"
                "from gpurm.rm.server.broker import EmbeddedBroker\nfrom gpurm.rm.security.brokerauth import load\n"
                "async def main():\n"
                f"    b = EmbeddedBroker({host!r}, {port}, load(Path({str(workdir / SECRET_FILE)!r})))\n"
                "    await b.start(); await asyncio.Event().wait()\n"
                "asyncio.run(main())\n"]
    with (workdir / "broker.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_port(port, host)
        yield TestBroker(f"mqtt://{host}:{port}", kind, auth,
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


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for the session (tests/pg.py); `pg_server.create_database()` gives a test
    its own database."""
    from tests.pg import run_postgres

    with run_postgres(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A database of its own on the session's PostgreSQL server, dropped after the test."""
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url)
