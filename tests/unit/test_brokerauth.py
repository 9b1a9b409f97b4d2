"""Broker credentials and rights (rm/security/brokerauth.py) and the rm.yaml keys that name them: pure code, files
only."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.security import brokerauth
from gpurm.rm.security.brokerauth import Action, BrokerAuthError, Role, may, topic_covered
from gpurm.rm.server.publisher import telemetry_problem

# Made by mosquitto_passwd 2.0.11 (`mosquitto_passwd -b -c pw alice 's3cret!'`).
MOSQUITTO_LINE = ("alice:$7$101$eaT/jCnmU5GfgBjB$1dpGjod53Fc3lP/cu1fEfD1+Ml7yqEq+Ow1XX23ECNwQLMwq3U6HLw+X3c5wX7R07Uy6"
                  "t6O3Di/j3My/eWq/CA==")


@pytest.mark.parametrize(("role", "action", "topic", "allowed"), [
    (Role.RM, Action.PUBLISH, "gpurm/cluster/delta", True),
    (Role.RM, Action.PUBLISH, "gpurm/telemetry/node-1", True),
    (Role.RM, Action.SUBSCRIBE, "gpurm/#", True),
    (Role.RM, Action.PUBLISH, "other/topic", False),
    (Role.RM, Action.SUBSCRIBE, "$SYS/#", False),
    (Role.READER, Action.PUBLISH, "gpurm/cluster/delta", False),
    (Role.READER, Action.PUBLISH, "gpurm/cluster/view", False),
    (Role.READER, Action.PUBLISH, "gpurm/telemetry/node-1", False),
    (Role.READER, Action.SUBSCRIBE, "gpurm/cluster/view", True),
    (Role.READER, Action.SUBSCRIBE, "gpurm/cluster/#", True),
    (Role.READER, Action.SUBSCRIBE, "gpurm/jobs/job-1", True),
    (Role.READER, Action.SUBSCRIBE, "gpurm/telemetry/+", True),
    (Role.READER, Action.SUBSCRIBE, "gpurm/#", False),           # wider than what it may read
    (Role.READER, Action.SUBSCRIBE, "gpurm/+/view", False),      # + could name gpurm/logs/view
    (Role.READER, Action.SUBSCRIBE, "#", False),
    (Role.READER, Action.SUBSCRIBE, "gpurm/logs/job-1/c", False),
    (Role.READER, Action.SUBSCRIBE, "$SYS/broker/clients", False),
    (None, Action.SUBSCRIBE, "gpurm/cluster/view", False),       # nobody else
])
def test_rights_of_each_role(role: Role | None, action: Action, topic: str, allowed: bool) -> None:
    assert may(role, action, topic) is allowed


def test_topic_covered_needs_the_whole_depth() -> None:
    assert topic_covered("a/b", "a/+")
    assert not topic_covered("a", "a/+")
    assert not topic_covered("a/b/c", "a/+")
    assert topic_covered("a/b/c", "a/#")


def test_mosquitto_hash_matches_mosquitto_passwd() -> None:
    _user, expected = MOSQUITTO_LINE.split(":", 1)
    _, _, iterations, salt, _ = expected.split("$")
    assert brokerauth.mosquitto_hash("s3cret!", base64.b64decode(salt), int(iterations)) == expected
    assert brokerauth.mosquitto_hash("s3cret?", base64.b64decode(salt), int(iterations)) != expected


def test_load_or_create_makes_a_private_secret_once(tmp_path: Path) -> None:
    auth = brokerauth.load_or_create(tmp_path / "rm")
    path = tmp_path / "rm" / brokerauth.SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (auth.rm.username, auth.reader.username) == ("gpurm-rm", "gpurm-reader")
    assert len(auth.rm.password) >= 32 and auth.rm.password != auth.reader.password
    assert brokerauth.load_or_create(tmp_path / "rm") == auth           # kept, not made again
    assert auth.rm.password not in repr(auth)                            # never in a log line
    assert auth.check_password("gpurm-reader", auth.reader.password) is Role.READER
    assert auth.check_password("gpurm-reader", auth.rm.password) is None
    assert auth.check_password(None, None) is None


@pytest.mark.parametrize(("content", "reason"), [
    ("not json", "not JSON"),
    (json.dumps({"rm": {"username": "a", "password": "x"}}), "reader: expected a username and a password"),
    (json.dumps({"rm": {"username": "a", "password": "x"}, "reader": {"username": "a", "password": "y"}}),
     "different usernames"),
])
def test_a_damaged_secret_is_refused_naming_the_file(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / brokerauth.SECRET_FILE
    path.write_text(content)
    with pytest.raises(BrokerAuthError) as err:
        brokerauth.load_or_create(tmp_path)
    assert str(path) in str(err.value) and reason in str(err.value)
    assert path.read_text() == content                                   # left as it was


def test_resolve_takes_configured_logins_and_the_secret_for_the_rest(tmp_path: Path) -> None:
    (tmp_path / "rm.pw").write_text("rm-password\n")
    auth = brokerauth.resolve(tmp_path / "state", ("svc-rm", str(tmp_path / "rm.pw")), ("", ""))
    assert (auth.rm.username, auth.rm.password) == ("svc-rm", "rm-password")
    assert auth.reader == brokerauth.load(tmp_path / "state" / brokerauth.SECRET_FILE).reader
    (tmp_path / "empty.pw").write_text("")
    with pytest.raises(BrokerAuthError, match=r"empty\.pw: empty"):
        brokerauth.resolve(tmp_path / "state", ("svc-rm", str(tmp_path / "empty.pw")), ("", ""))


def test_mosquitto_files(tmp_path: Path) -> None:
    auth = brokerauth.load_or_create(tmp_path)
    files = brokerauth.write_mosquitto_files(auth, tmp_path / "out", "127.0.0.1", 18883)
    users = dict(line.split(":", 1) for line in files.passwd.read_text().splitlines())
    assert set(users) == {"gpurm-rm", "gpurm-reader"}
    assert all(h.startswith("$7$101$") for h in users.values())
    assert auth.rm.password not in files.passwd.read_text()
    assert stat.S_IMODE(files.passwd.stat().st_mode) & 0o007 == 0        # nobody else reads the hashes
    acl = files.acl.read_text()
    assert "user gpurm-rm\ntopic readwrite gpurm/#" in acl
    assert "user gpurm-reader\ntopic read gpurm/cluster/#\ntopic read gpurm/jobs/#\ntopic read gpurm/telemetry/#" \
        in acl
    assert "write" not in acl.split("user gpurm-reader")[1]
    conf = files.conf.read_text().splitlines()
    assert conf[:2] == ["listener 18883 127.0.0.1", "allow_anonymous false"]
    assert f"password_file {files.passwd.resolve()}" in conf and f"acl_file {files.acl.resolve()}" in conf


def test_rm_yaml_broker_logins(tmp_path: Path) -> None:
    cfg_path = tmp_path / "rm.yaml"
    cfg_path.write_text("mqtt: {url: 'mqtt://10.0.0.5:1883', username: rm, password_file: rm.pw,\n"
                        "       reader_username: ro, reader_password_file: /etc/gpurm/ro.pw}\n")
    cfg = load_rm_config(cfg_path)
    assert (cfg.mqtt_username, cfg.mqtt_password_file) == ("rm", str(tmp_path / "rm.pw"))
    assert (cfg.mqtt_reader_username, cfg.mqtt_reader_password_file) == ("ro", "/etc/gpurm/ro.pw")


@pytest.mark.parametrize(("mqtt", "problem"), [
    ("{username: rm}", "mqtt.password_file: required with mqtt.username"),
    ("{reader_password_file: ro.pw}", "mqtt.reader_username: required with mqtt.reader_password_file"),
    ("{username: x, password_file: a, reader_username: x, reader_password_file: b}",
     "mqtt.reader_username: must differ from mqtt.username"),
])
def test_rm_yaml_half_a_login_is_refused(tmp_path: Path, mqtt: str, problem: str) -> None:
    cfg_path = tmp_path / "rm.yaml"
    cfg_path.write_text(f"mqtt: {mqtt}\n")
    with pytest.raises(ConfigError) as err:
        load_rm_config(cfg_path)
    assert any(problem in p for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(("node_id", "payload", "problem"), [
    ("node-1", b'{"node_id": "node-1", "gpus": []}', ""),
    ("node-1", b'{"gpus": []}', ""),
    ("node-1", b'{"node_id": "node-2"}', "names node 'node-2', not the sender 'node-1'"),
    ("node-1", b"[1, 2]", "expected a JSON object, got list"),
    ("node-1", b"\xff not json", "telemetry: not JSON"),
    ("node-1", b'{"pad": "' + b"x" * (64 * 1024) + b'"}', "the most is 65536"),
    ("a/b", b"{}", "cannot be one MQTT topic level"),
    ("#", b"{}", "cannot be one MQTT topic level"),
])
def test_what_the_rm_republishes_from_a_heartbeat(node_id: str, payload: bytes, problem: str) -> None:
    got = telemetry_problem(node_id, payload)
    assert (problem in got and got != "") if problem else got == ""
