"""The `tls:` section of rm.yaml / agent.yaml and GPURM_TLS_* for the CLI and AM: all three files or none,
each one readable PEM, relative paths from the config file, errors naming the field and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.tls import ENV_CA, ENV_CERT, ENV_KEY, node_of, tls_from_env
from gpurm.nodeagent.config import load_agent_config
from gpurm.rm.config import load_rm_config

CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    d.mkdir()
    (d / "ca.pem").write_text(CERT)
    (d / "rm.pem").write_text(CERT)
    (d / "rm-key.pem").write_text(KEY)
    return d


def rm_yaml(tmp_path: Path, tls: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(f"listen: 127.0.0.1:7070\n{tls}\n")
    return path


def problems(call: object) -> list[str]:
    with pytest.raises(ConfigError) as err:
        call()  # type: ignore[operator]
    return err.value.problems


def test_no_tls_section_means_plaintext(tmp_path: Path) -> None:
    assert load_rm_config(rm_yaml(tmp_path, "")).tls is None
    assert load_rm_config(None).tls is None


def test_paths_are_relative_to_the_config_file(tmp_path: Path, pki: Path) -> None:
    cfg = load_rm_config(rm_yaml(tmp_path, "tls: {ca: pki/ca.pem, cert: pki/rm.pem, key: pki/rm-key.pem}"))
    assert cfg.tls is not None
    assert cfg.tls.ca == pki / "ca.pem" and cfg.tls.key == pki / "rm-key.pem"
    assert cfg.tls.cert_pem == CERT.encode()
    assert cfg.tls.env() == {ENV_CA: str(pki / "ca.pem"), ENV_CERT: str(pki / "rm.pem"),
                             ENV_KEY: str(pki / "rm-key.pem")}


def test_only_two_of_three(tmp_path: Path, pki: Path) -> None:
    got = problems(lambda: load_rm_config(rm_yaml(tmp_path, "tls: {ca: pki/ca.pem, cert: pki/rm.pem}")))
    assert got == ["tls.key: is required with tls.ca, tls.cert (ca, cert and key go together)"]


def test_a_missing_key_file_is_named(tmp_path: Path, pki: Path) -> None:
    got = problems(lambda: load_rm_config(rm_yaml(
        tmp_path, "tls: {ca: pki/ca.pem, cert: pki/rm.pem, key: pki/nope.pem}")))
    assert len(got) == 1
    assert got[0].startswith(f"tls.key: cannot read {pki / 'nope.pem'}: "), got


def test_files_that_are_not_pem(tmp_path: Path, pki: Path) -> None:
    (pki / "junk").write_text("hello\n")
    got = problems(lambda: load_rm_config(rm_yaml(tmp_path, "tls: {ca: pki/junk, cert: pki/rm-key.pem, "
                                                            "key: pki/rm.pem}")))
    assert got == [f"tls.ca: {pki / 'junk'} is not a PEM CA certificate",
                   f"tls.cert: {pki / 'rm-key.pem'} is not a PEM certificate",
                   f"tls.key: {pki / 'rm.pem'} is not a PEM private key"]


def test_unknown_fields_and_wrong_shapes(tmp_path: Path, pki: Path) -> None:
    got = problems(lambda: load_rm_config(rm_yaml(
        tmp_path, "tls: {ca: pki/ca.pem, cert: pki/rm.pem, key: pki/rm-key.pem, verify: false}")))
    assert len(got) == 1 and got[0].startswith("tls.verify: unknown field"), got
    got = problems(lambda: load_rm_config(rm_yaml(tmp_path, "tls: pki/ca.pem")))
    assert got and got[0].startswith("tls:"), got


def test_the_agent_config_takes_the_same_section(tmp_path: Path, pki: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("gpus: {fake: 2}\nmemory_mib: 1000\ntls: {ca: pki/ca.pem, cert: pki/rm.pem, key: pki/rm-key.pem}\n"
                    "am_tls: {cert: pki/rm.pem, key: pki/rm-key.pem}\n")   # am_tls: required of a root agent
    cfg = load_agent_config(path, environ={})
    assert cfg.tls is not None and cfg.tls.cert == pki / "rm.pem"
    assert cfg.am_tls is not None and (cfg.am_tls.ca, cfg.am_tls.key) == (pki / "ca.pem", pki / "rm-key.pem")
    path.write_text("gpus: {fake: 2}\nmemory_mib: 1000\ntls: {cert: pki/rm.pem}\n")
    got = problems(lambda: load_agent_config(path, environ={}))
    assert "tls.ca: is required with tls.cert (ca, cert and key go together)" in got
    assert "tls.key: is required with tls.cert (ca, cert and key go together)" in got


def test_environment_for_the_cli_and_the_am(pki: Path) -> None:
    assert tls_from_env({}) is None
    full = {ENV_CA: str(pki / "ca.pem"), ENV_CERT: str(pki / "rm.pem"), ENV_KEY: str(pki / "rm-key.pem")}
    got = tls_from_env(full)
    assert got is not None and got.key_pem == KEY.encode()
    assert problems(lambda: tls_from_env({ENV_CA: str(pki / "ca.pem")})) == [
        f"{ENV_CERT}: is required with {ENV_CA} (ca, cert and key go together)",
        f"{ENV_KEY}: is required with {ENV_CA} (ca, cert and key go together)"]
    got_problems = problems(lambda: tls_from_env({**full, ENV_KEY: str(pki / "gone.pem")}))
    assert got_problems[0].startswith(f"{ENV_KEY}: cannot read {pki / 'gone.pem'}"), got_problems


def test_node_certificate_names() -> None:
    assert node_of("node:gpu-7") == "gpu-7"
    assert node_of("alice") is None
    assert node_of("node:") is None
    assert node_of(None) is None
