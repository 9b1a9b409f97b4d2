"""A throwaway PostgreSQL server for the tests: `initdb` + `pg_ctl` in a temp dir, on a free port, listening on
127.0.0.1 only (no Unix socket), trust auth for the test user. Never the machine's own server on 5432.

initdb refuses to run as root: as root the server's binaries run as the `postgres` user (runuser), its data dir
chowned to it. Missing binaries fail the test with what to install.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port

USER = "gpurm_test"
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
HINT = ("install the PostgreSQL server (Debian: apt-get install postgresql, then put /usr/lib/postgresql/*/bin on "
        "PATH) and the psycopg package (./scripts/setup-venv)")


@dataclass
class PgServer:
    port: int
    data: Path
    host: str = "127.0.0.1"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}".encode())
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    if shutil.which("runuser") is None:
        pytest.fail("the tests run as root and initdb refuses root: runuser (util-linux) is needed to run it as "
                    "the postgres user")
    return ["runuser", "-u", "postgres", "--", *argv]


def server_binary(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, else Debian's place for it (the newest version installed)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
                      key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return str(versions[-1]) if versions else None


@contextlib.contextmanager
def run_postgres(workdir: Path, durable: bool = False, host: str = "127.0.0.1") -> Iterator[PgServer]:
    """`durable`: fsync on, as a production server (benchmarks); the tests' server skips it (speed). `host`: the
    address it listens on (a bridge's: clients in network namespaces on it are trusted too)."""
    missing = [b for b in SERVER_BINARIES if server_binary(b) is None]
    if missing:
        pytest.fail(f"PostgreSQL binaries missing (PATH, /usr/lib/postgresql/*/bin): {', '.join(missing)}; {HINT}")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail(f"psycopg is not installed; {HINT}")
    data = workdir / "pgdata"
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("the tests run as root and initdb refuses root: add a `postgres` user (or run as another "
                        "user)")
        workdir.mkdir(parents=True, exist_ok=True)
        os.chown(workdir, owner.pw_uid, owner.pw_gid)
    port = free_port()
    log = workdir / "postgres.log"

    def run(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_server_user([str(server_binary(name)), *argv]), cwd=workdir, capture_output=True,
                              text=True, check=False, timeout=60)

    done = run("initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
    if done.returncode != 0:
        pytest.fail(f"initdb failed: {done.stderr.strip()[-1000:]}")
    if host != "127.0.0.1":
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all {USER} samenet trust\n")   # the bridge's subnet: the RMs in namespaces on it
    options = (f"-c listen_addresses={host} -p {port} -c unix_socket_directories='' -c max_connections=50 "
               + ("-c shared_buffers=128MB" if durable
                  else "-c fsync=off -c full_page_writes=off -c shared_buffers=16MB"))
    done = run("pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "30", "-o", options, "start")
    if done.returncode != 0:
        text = log.read_text()[-1000:] if log.exists() else ""
        pytest.fail(f"pg_ctl start failed: {done.stderr.strip()[-500:]} {text}")
    try:
        yield PgServer(port, data, host)
    finally:
        run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
