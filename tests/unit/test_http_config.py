"""rm.yaml `http:`: on by default on loopback, turned off by `enabled: false`, every problem naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import HTTP_PORT, load_rm_config

ROOT = Path(__file__).resolve().parents[2]


def problems(overrides: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_rm_config(None, overrides)
    return err.value.problems


def test_on_by_default_on_loopback() -> None:
    cfg = load_rm_config(None).http
    assert cfg.enabled and cfg.listen == f"127.0.0.1:{HTTP_PORT}" and cfg.max_body_bytes == 1 << 20


def test_the_shipped_rm_yaml_documents_the_defaults() -> None:
    cfg = load_rm_config(ROOT / "configs" / "rm.yaml").http
    assert cfg == load_rm_config(None).http
    assert "http:" in (ROOT / "configs" / "rm.yaml").read_text()


def test_settings_are_read() -> None:
    cfg = load_rm_config(None, {"http": {"enabled": False, "listen": "0.0.0.0:0", "max_body_bytes": 4096}}).http
    assert not cfg.enabled and cfg.listen == "0.0.0.0:0" and cfg.max_body_bytes == 4096


@pytest.mark.parametrize(("section", "expected"), [
    ({"listen": "nowhere"}, "http.listen: expected HOST:PORT"),
    ({"listen": "127.0.0.1:99999"}, "http.listen: port must be a number from 0 to 65535"),
    ({"enabled": "yes"}, "http.enabled: must be true or false"),
    ({"max_body_bytes": 10}, "http.max_body_bytes: must be at least 1024"),
    ({"port": 80}, "http.port: unknown field"),
    ("on", "http: expected a mapping of fields"),
])
def test_problems_name_the_field(section: object, expected: str) -> None:
    got = problems({"http": section})
    assert any(expected in p for p in got), got
