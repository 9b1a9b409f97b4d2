"""Broker credentials: who may do what on the MQTT broker.

Two roles, and nobody else may connect (no anonymous clients):

- `gpurm-rm` (the RM alone): publishes and subscribes anywhere under `gpurm/#`.
- `gpurm-reader` (agents, AMs, the CLI): subscribes only, to `gpurm/cluster/#`, `gpurm/jobs/#` and
  `gpurm/telemetry/#`; it may publish nothing.

The passwords are random and made once: `load_or_create(state_dir)` keeps them in the RM's state dir in
`broker.secret` (JSON, mode 0600). An external broker is given the same credentials by
`gpurm admin broker-files` (mosquitto password and ACL files written from that secret), or its own, named in
rm.yaml (`mqtt.username`/`password_file`, `mqtt.reader_username`/`reader_password_file`).
"""

from __future__ import annotations

import base64
import contextlib
import enum
import grp
import hashlib
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gpurm.common.mqtt import Credentials

log = logging.getLogger(__name__)

SECRET_FILE = "broker.secret"
RM_USERNAME = "gpurm-rm"
READER_USERNAME = "gpurm-reader"
RM_TOPICS = ("gpurm/#",)
READER_TOPICS = ("gpurm/cluster/#", "gpurm/jobs/#", "gpurm/telemetry/#")

# mosquitto's own password format ($7$: PBKDF2-HMAC-SHA512; see mosquitto's src/password_mosq.c).
MOSQUITTO_ITERATIONS = 101
MOSQUITTO_SALT_BYTES = 12
MOSQUITTO_HASH_BYTES = 64
MOSQUITTO_GROUP = "mosquitto"  # the group a packaged mosquitto runs as


class BrokerAuthError(Exception):
    """A credentials file that cannot be read or makes no sense; the message names the file and the reason."""


class Role(enum.Enum):
    RM = "rm"
    READER = "reader"


class Action(enum.Enum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True)
class BrokerAuth:
    """The credentials of both roles."""

    rm: Credentials
    reader: Credentials

    def role_of(self, username: str | None) -> Role | None:
        if username == self.rm.username:
            return Role.RM
        if username == self.reader.username:
            return Role.READER
        return None

    def check_password(self, username: str | None, password: str | None) -> Role | None:
        """The role of a client presenting these credentials, or None (unknown user, wrong or no password)."""
        role = self.role_of(username)
        if role is None or password is None:
            return None
        expected = self.rm.password if role is Role.RM else self.reader.password
        return role if secrets.compare_digest(password.encode(), expected.encode()) else None


def new_password() -> str:
    return secrets.token_urlsafe(32)


def load_or_create(state_dir: Path) -> BrokerAuth:
    """The credentials kept in `state_dir/broker.secret`; made (random, mode 0600) when the file is absent."""
    path = state_dir / SECRET_FILE
    with contextlib.suppress(FileNotFoundError):
        return load(path)
    auth = BrokerAuth(Credentials(RM_USERNAME, new_password()), Credentials(READER_USERNAME, new_password()))
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({role.value: {"username": c.username, "password": c.password}
                   for role, c in ((Role.RM, auth.rm), (Role.READER, auth.reader))}, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # never replaces a file another process made meanwhile
    except FileExistsError:
        return load(path)
    finally:
        tmp.unlink()
    log.info("made new MQTT broker credentials in %s", path)
    return auth


def load(path: Path) -> BrokerAuth:
    """Read a `broker.secret`; FileNotFoundError when absent, BrokerAuthError when unreadable or malformed."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BrokerAuthError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise BrokerAuthError(f"{path}: not JSON: {exc}") from None
    if path.stat().st_mode & 0o077:
        log.warning("%s is readable by others (mode %o): it holds the broker passwords; chmod 600 it", path,
                    path.stat().st_mode & 0o777)
    roles = []
    for role in Role:
        entry = data.get(role.value) if isinstance(data, dict) else None
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry.get(k)
                                                  for k in ("username", "password")):
            raise BrokerAuthError(f"{path}: {role.value}: expected a username and a password")
        roles.append(Credentials(entry["username"], entry["password"]))
    if roles[0].username == roles[1].username:
        raise BrokerAuthError(f"{path}: the rm and reader roles need different usernames")
    return BrokerAuth(roles[0], roles[1])


def resolve(state_dir: Path, rm_login: tuple[str, str], reader_login: tuple[str, str]) -> BrokerAuth:
    """The RM's broker credentials: each role's (username, password file) from rm.yaml; a role given as ("", "")
    takes its credentials from `state_dir/broker.secret` (made when absent)."""
    logins = []
    stored: BrokerAuth | None = None
    for role, (username, password_file) in ((Role.RM, rm_login), (Role.READER, reader_login)):
        if username:
            logins.append(Credentials(username, read_password_file(Path(password_file))))
            continue
        stored = stored or load_or_create(state_dir)
        logins.append(stored.rm if role is Role.RM else stored.reader)
    if logins[0].username == logins[1].username:
        raise BrokerAuthError(f"the rm and reader roles need different usernames, both are {logins[0].username!r}")
    return BrokerAuth(logins[0], logins[1])


def read_password_file(path: Path) -> str:
    """The password in a file (its first line, without the line end); BrokerAuthError when unreadable or empty."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BrokerAuthError(f"{path}: cannot read: {exc.strerror}") from None
    lines = text.splitlines()
    password = lines[0] if lines else ""
    if not password:
        raise BrokerAuthError(f"{path}: empty: expected the password on its first line")
    return password


# ------------------------------------------------------------------ topic rights


def topic_covered(topic: str, pattern: str) -> bool:
    """Whether every topic that `topic` (a topic name, or a subscription filter with + and #) can name is
    matched by `pattern`. A filter wider than the pattern (e.g. `gpurm/#` against `gpurm/jobs/#`) is not."""
    got = topic.split("/")
    allowed = pattern.split("/")
    for i, level in enumerate(allowed):
        if level == "#":
            return True
        if i >= len(got):
            return False
        if got[i] == "#":
            return False
        if level != "+" and got[i] != level:
            return False
    return len(got) == len(allowed)


def topics_for(role: Role, action: Action) -> tuple[str, ...]:
    if role is Role.RM:
        return RM_TOPICS
    return READER_TOPICS if action is Action.SUBSCRIBE else ()


def may(role: Role | None, action: Action, topic: str) -> bool:
    """Whether `role` may publish on, or subscribe to, `topic`; nobody may touch $SYS or other roots."""
    if role is None or topic.startswith("$"):
        return False
    return any(topic_covered(topic, p) for p in topics_for(role, action))


# ------------------------------------------------------------------ mosquitto


def mosquitto_hash(password: str, salt: bytes | None = None, iterations: int = MOSQUITTO_ITERATIONS) -> str:
    """`$7$ITERATIONS$SALT$HASH` as mosquitto_passwd writes it (PBKDF2-HMAC-SHA512, base64 with padding)."""
    salt = secrets.token_bytes(MOSQUITTO_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, MOSQUITTO_HASH_BYTES)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def mosquitto_passwd(auth: BrokerAuth) -> str:
    return "".join(f"{c.username}:{mosquitto_hash(c.password)}\n" for c in (auth.rm, auth.reader))


def mosquitto_acl(auth: BrokerAuth) -> str:
    lines = [f"user {auth.rm.username}", *(f"topic readwrite {t}" for t in RM_TOPICS), "",
             f"user {auth.reader.username}", *(f"topic read {t}" for t in READER_TOPICS), ""]
    return "\n".join(lines)


def mosquitto_conf(host: str, port: int, passwd: Path, acl: Path) -> str:
    return (f"listener {port} {host}\n"
            "allow_anonymous false\n"
            f"password_file {passwd}\n"
            f"acl_file {acl}\n")


@dataclass(frozen=True)
class MosquittoFiles:
    passwd: Path
    acl: Path
    conf: Path


def write_mosquitto_files(auth: BrokerAuth, out_dir: Path, host: str, port: int,
                          group: str = MOSQUITTO_GROUP) -> MosquittoFiles:
    """Write `passwd`, `acl` and `mosquitto.conf` (a snippet to include) into out_dir.

    `passwd` is 0600; run as root where `group` exists, it is 0640 and that group's, because mosquitto started
    as root reads it after dropping to its own user."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = MosquittoFiles(out_dir / "passwd", out_dir / "acl", out_dir / "mosquitto.conf")
    _write_private(files.passwd, mosquitto_passwd(auth))
    gid = _group_id(group) if os.geteuid() == 0 else None
    if gid is not None:
        os.chown(files.passwd, 0, gid)
        os.chmod(files.passwd, 0o640)
    files.acl.write_text(mosquitto_acl(auth))
    files.conf.write_text(mosquitto_conf(host, port, files.passwd.resolve(), files.acl.resolve()))
    return files


def _group_id(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
