"""Container and AM tokens: HMAC-SHA256 signatures made by the RM, checked by agents and the RM itself.

A container token binds container id, job, node, GPU indices, user and expiry, so an agent starts only what
the RM granted. The key lives in the RM's state dir and reaches agents in their registration reply (as YARN
hands NodeManagers the container-token master key).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gpurm.proto import gpurm_pb2 as pb

KEY_BYTES = 32


class TokenError(Exception):
    """A token was missing, forged, expired or issued for something else."""


@dataclass(frozen=True)
class TokenKey:
    key_id: int
    secret: bytes


def load_or_create_key(path: Path) -> TokenKey:
    """Read the RM's signing key, creating it (mode 0600) on first start."""
    if path.exists():
        raw = path.read_bytes()
        key_id_text, _, hex_secret = raw.decode().strip().partition(":")
        return TokenKey(int(key_id_text), bytes.fromhex(hex_secret))
    path.parent.mkdir(parents=True, exist_ok=True)
    key = TokenKey(1, secrets.token_bytes(KEY_BYTES))
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{key.key_id}:{key.secret.hex()}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return key


def _mac(secret: bytes, data: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()


def sign_container(payload: pb.ContainerTokenPayload, key: TokenKey) -> pb.ContainerToken:
    data = payload.SerializeToString(deterministic=True)
    return pb.ContainerToken(payload=data, signature=_mac(key.secret, data), key_id=key.key_id)


def verify_container(token: pb.ContainerToken, key: TokenKey, *, node_id: str, now_ms: int) -> pb.ContainerTokenPayload:
    """The payload of a valid token for this node; TokenError says why otherwise."""
    if not token.payload or not token.signature:
        raise TokenError("missing container token")
    if token.key_id != key.key_id:
        raise TokenError(f"token signed with unknown key {token.key_id}")
    if not hmac.compare_digest(_mac(key.secret, token.payload), token.signature):
        raise TokenError("bad token signature")
    payload = pb.ContainerTokenPayload()
    payload.ParseFromString(token.payload)
    if payload.node_id != node_id:
        raise TokenError(f"token is for node {payload.node_id}, not {node_id}")
    if payload.expiry_ms and payload.expiry_ms < now_ms:
        raise TokenError("token expired")
    return payload


def am_token(key: TokenKey, job_id: str, am_attempt: int) -> str:
    """The secret an AM proves itself with: it reaches the AM through its container's environment."""
    return _mac(key.secret, f"am:{job_id}:{am_attempt}".encode()).hex()


def check_am_token(key: TokenKey, job_id: str, am_attempt: int, presented: str) -> bool:
    return hmac.compare_digest(am_token(key, job_id, am_attempt), presented)
