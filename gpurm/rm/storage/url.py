"""Which store the RM keeps its state in: rm.yaml `store.url`, parsed and opened in one place.

- `sqlite:///ABS/PATH` (the default, `STATE_DIR/state.db`): one SQLite file (rm/storage/store.py).
- `postgresql://USER@HOST:PORT/DBNAME` (or `postgres://`): a PostgreSQL database (rm/storage/postgres.py). The password
comes
  from the URL, or libpq's own sources (PGPASSWORD, ~/.pgpass or PGPASSFILE); it is never logged: every message
  shows the URL through `redact`.

`open_store` is what the daemon, `gpurm admin store` and the tests call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from gpurm.rm.storage.store import RMStore

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
STORE_FILE = "state.db"


@dataclass(frozen=True)
class StoreURL:
    kind: str              # SQLITE or POSTGRESQL
    url: str               # as given (may carry a password: never log it; use `shown`)
    path: Path | None      # the SQLite file

    @property
    def shown(self) -> str:
        return redact(self.url)


def redact(url: str) -> str:
    """The URL without its password (and without any query string, which may carry one)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hostport}" if user else hostport
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def default_url(state_dir: Path) -> str:
    return f"sqlite://{(state_dir / STORE_FILE).absolute()}"


def parse_store_url(url: str, state_dir: Path | None = None) -> StoreURL:
    """ValueError saying why when `url` is not a store URL gpurm can open. Empty: the state dir's SQLite file."""
    if not isinstance(url, str):
        raise ValueError(f"must be a string such as postgresql://gpurm@db:5432/gpurm, got {type(url).__name__}")
    if not url:
        if state_dir is None:
            raise ValueError("is empty")
        url = default_url(state_dir)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("must be sqlite:///ABS/PATH or postgresql://USER@HOST:PORT/DBNAME")
    if scheme == SQLITE:
        if not rest.startswith("/") or rest.startswith("//"):
            raise ValueError(f"sqlite:// takes an absolute path (sqlite:///var/lib/gpurm/rm/state.db), got "
                             f"{redact(url)!r}")
        if rest.endswith("/"):
            raise ValueError(f"the sqlite path must name a file, got {rest!r}")
        return StoreURL(SQLITE, url, Path(rest))
    if scheme in ("postgresql", "postgres"):
        try:
            parts = urlsplit(url)
            port = parts.port        # ValueError when not a number in range
        except ValueError as exc:
            raise ValueError(f"{redact(url)!r} is not a valid URL: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"names no host: postgresql://USER@HOST:PORT/DBNAME, got {redact(url)!r}")
        if not parts.path.strip("/"):
            raise ValueError(f"names no database: postgresql://USER@HOST:PORT/DBNAME, got {redact(url)!r}")
        if port == 0:
            raise ValueError(f"port must be 1 to 65535, got {redact(url)!r}")
        try:
            from psycopg.conninfo import conninfo_to_dict

            conninfo_to_dict(url)
        except ImportError:
            raise ValueError("needs psycopg (pip install 'psycopg[binary]>=3.2'; ./scripts/setup-venv installs it)"
                             ) from None
        except Exception as exc:     # psycopg.ProgrammingError: libpq's own parse of the URL
            raise ValueError(f"{redact(url)!r} is not a libpq URL: {str(exc).strip()[:200]}") from None
        return StoreURL(POSTGRESQL, url, None)
    raise ValueError(f"scheme {scheme[:20]!r} is not one gpurm stores in (sqlite://, postgresql://)")


def open_store(url: str, state_dir: Path, *, exclusive: bool = False) -> RMStore:
    """Open (create, migrate) the store `url` names (empty: STATE_DIR/state.db). `exclusive`: the RM's own open,
    which holds the store's lock for the process's life (PostgreSQL; a SQLite store is held by the state dir's
    lock). StoreDamaged / StoreWriteError as the stores raise them; ValueError for a bad URL."""
    parsed = parse_store_url(url, state_dir)
    if parsed.kind == SQLITE:
        from gpurm.rm.storage.store import SqliteStore

        assert parsed.path is not None
        return SqliteStore(parsed.path)
    from gpurm.rm.storage.postgres import PostgresStore

    return PostgresStore(parsed.url, exclusive=exclusive)
