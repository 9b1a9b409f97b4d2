"""rm.yaml `store.url`: which store the RM opens, and a bad URL named as a config error (never its password)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.storage.store import SqliteStore
from gpurm.rm.storage.url import POSTGRESQL, SQLITE, open_store, parse_store_url, redact


def test_the_default_is_the_state_dirs_sqlite_file(tmp_path: Path) -> None:
    parsed = parse_store_url("", tmp_path)
    assert parsed.kind == SQLITE and parsed.path == tmp_path / "state.db"
    store = open_store("", tmp_path)
    assert isinstance(store, SqliteStore) and store.path == tmp_path / "state.db"
    store.close()
    other = open_store(f"sqlite://{tmp_path / 'x' / 'rm.db'}", tmp_path)
    assert isinstance(other, SqliteStore) and (tmp_path / "x" / "rm.db").exists()
    other.close()


def test_postgresql_urls_parse_and_hide_their_password() -> None:
    for url in ("postgresql://gpurm@db1:5432/gpurm", "postgres://gpurm:pw@db1/gpurm?sslmode=require",
                "postgresql://gpurm@[::1]:5433/rm"):
        assert parse_store_url(url).kind == POSTGRESQL
    assert redact("postgresql://gpurm:s3cret@db1:5432/gpurm?password=x") == "postgresql://gpurm@db1:5432/gpurm"
    assert redact("postgresql://:s3cret@db1/gpurm") == "postgresql://db1/gpurm"


@pytest.mark.parametrize(("url", "why"), [
    ("mysql://u@h/db", "scheme 'mysql' is not one gpurm stores in"),
    ("sqlite://relative/state.db", "sqlite:// takes an absolute path"),
    ("sqlite:///var/lib/", "must name a file"),
    ("postgresql://gpurm:s3cret@/gpurm", "names no host"),
    ("postgresql://gpurm:s3cret@db1:5432/", "names no database"),
    ("postgresql://gpurm:s3cret@db1:99999/gpurm", "not a valid URL"),
    ("state.db", "must be sqlite:///ABS/PATH or postgresql://"),
])
def test_a_bad_url_says_why_without_the_password(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as exc:
        parse_store_url(url)
    assert "s3cret" not in str(exc.value)


def test_rm_yaml_store_url(tmp_path: Path) -> None:
    path = tmp_path / "rm.yaml"
    path.write_text("store: {url: 'postgresql://gpurm@db1:5432/gpurm', backups: 3}\n")
    cfg = load_rm_config(path)
    assert cfg.store_url == "postgresql://gpurm@db1:5432/gpurm" and cfg.store_backups == 3
    path.write_text("store: {url: 'postgresql://gpurm:s3cret@db1:5432'}\n")
    with pytest.raises(ConfigError) as exc:
        load_rm_config(path)
    text = "; ".join(exc.value.problems)
    assert "store.url" in text and "names no database" in text and "s3cret" not in text
    path.write_text("{}\n")
    assert load_rm_config(path).store_url == ""
