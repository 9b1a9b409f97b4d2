"""Credentials the RM makes: per-node keys, node join proofs, container tokens and AM tokens (HMAC-SHA256).

Everything derives from one cluster secret that never leaves the RM's state dir (file `token.key`, 0600):

- a **node key** per node, HMAC(secret, "node|<node_id>"): the agent of that node alone holds it (handed over in
  the registration reply only over mTLS to the node's own certificate; without mTLS the admin copies it into the
  agent's `node_secret_file`, `gpurm admin node-secret NODE`). It signs that node's container tokens and proves the
  node's registrations, so a stolen node key is good for that node alone;
- the **AM key**, HMAC(secret, "am"), never sent anywhere: AM tokens (bound to one job, one AM attempt and an
  expiry) are checked by the RM alone and cannot be made from any node's key.

A container token binds container, job, node, GPUs, user, attempt, one purpose and an expiry (minutes: the RM
renews the tokens of live grants through the AM's allocate calls).
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
NODE_KEY_ID = 2          # container tokens signed with a per-node key (1 was the old cluster-wide key)
AM_TOKEN_VERSION = "v1"
JOIN_WINDOW_MS = 5 * 60 * 1000   # a join proof is good this long either side of the RM's clock


class TokenError(Exception):
    """A token was missing, forged, expired or issued for something else."""


@dataclass(frozen=True)
class TokenKey:
    key_id: int
    secret: bytes


def _mac(secret: bytes, data: bytes) -> bytes:
    return hmac.new(secret, data, hashlib.sha256).digest()


def load_or_create_key(path: Path) -> TokenKey:
    """Read the cluster secret, creating it (mode 0600) on first start."""
    if path.exists():
        raw = path.read_bytes()
        key_id_text, _, hex_secret = raw.decode().strip().partition(":")
        return TokenKey(int(key_id_text), bytes.fromhex(hex_secret))
    key = TokenKey(1, secrets.token_bytes(KEY_BYTES))
    write_secret_file(path, f"{key.key_id}:{key.secret.hex()}")
    return key


@dataclass(frozen=True)
class ClusterKeys:
    """The keys the RM derives from its cluster secret."""

    secret: bytes

    @classmethod
    def load(cls, path: Path) -> ClusterKeys:
        return cls(load_or_create_key(path).secret)

    def node_key(self, node_id: str) -> TokenKey:
        return TokenKey(NODE_KEY_ID, _mac(self.secret, b"node|" + node_id.encode()))

    @property
    def am_key(self) -> bytes:
        return _mac(self.secret, b"am")

    def check_join(self, node_id: str, instance: str, join_time_ms: int, proof: bytes, now_ms: int) -> str:
        """Why this join proof does not prove `node_id`'s secret ('' when it does)."""
        if not proof:
            return ("no join proof: without mTLS an agent proves its node with node_secret_file in agent.yaml "
                    f"(`gpurm admin node-secret {node_id[:128]}` on the RM host prints it)")
        if abs(now_ms - join_time_ms) > JOIN_WINDOW_MS:
            return (f"join proof made at {join_time_ms} ms is more than {JOIN_WINDOW_MS // 60000} minutes from the "
                    "RM's clock (replayed, or the clocks differ: run NTP)")
        want = join_proof(self.node_key(node_id).secret, node_id, instance, join_time_ms)
        if not hmac.compare_digest(want, proof):
            return f"join proof does not match node {node_id[:128]}'s secret"
        return ""


def parse_node_secret(text: str) -> TokenKey:
    """A node secret as `gpurm admin node-secret` prints it (hex); ValueError says what is wrong."""
    text = text.strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError("not a hex string (copy it from `gpurm admin node-secret NODE`)") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{len(raw)} bytes, want {KEY_BYTES} (copy it from `gpurm admin node-secret NODE`)")
    return TokenKey(NODE_KEY_ID, raw)


def join_proof(node_secret: bytes, node_id: str, instance: str, join_time_ms: int) -> bytes:
    return _mac(node_secret, f"join|{node_id}|{instance}|{join_time_ms}".encode())


# ---------------------------------------------------------------- container tokens

def sign_container(payload: pb.ContainerTokenPayload, key: TokenKey) -> pb.ContainerToken:
    data = payload.SerializeToString(deterministic=True)
    return pb.ContainerToken(payload=data, signature=_mac(key.secret, data), key_id=key.key_id)


def verify_container(token: pb.ContainerToken, key: TokenKey, *, node_id: str, now_ms: int,
                     purpose: int = pb.TOKEN_CONTAINER) -> pb.ContainerTokenPayload:
    """The payload of a valid, unexpired token for this node and purpose; TokenError says why otherwise."""
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
    if payload.purpose != purpose:
        raise TokenError(f"token is for {_purpose_name(payload.purpose)}, not {_purpose_name(purpose)}")
    if not payload.expiry_ms:
        raise TokenError("token has no expiry")
    if payload.expiry_ms < now_ms:
        raise TokenError(f"token expired {(now_ms - payload.expiry_ms) / 1000:.0f} s ago")
    return payload


def _purpose_name(purpose: int) -> str:
    return pb.TokenPurpose.Name(purpose) if purpose in pb.TokenPurpose.values() else f"purpose {purpose}"


# ---------------------------------------------------------------- AM tokens

def am_token(am_key: bytes, job_id: str, am_attempt: int, expiry_ms: int) -> str:
    """The secret an AM proves itself with: `v1.<expiry ms>.<hex mac>`, good for one job's one AM attempt."""
    mac = _mac(am_key, f"am|{job_id}|{am_attempt}|{expiry_ms}".encode()).hex()
    return f"{AM_TOKEN_VERSION}.{expiry_ms}.{mac}"


def am_token_expiry(presented: str) -> int:
    """The expiry (ms) written in an AM token; 0 for one that is not well formed."""
    parts = presented.split(".")
    if len(parts) != 3 or parts[0] != AM_TOKEN_VERSION or not parts[1].isdigit() or len(parts[1]) > 15:
        return 0
    return int(parts[1])


def check_am_token(am_key: bytes, job_id: str, am_attempt: int, presented: str, now_ms: int) -> str:
    """Why `presented` is not a valid AM token for this job and attempt now ('' when it is)."""
    if not presented:
        return "missing AM token"
    expiry = am_token_expiry(presented[:200])
    if not expiry:
        return "malformed AM token"
    if not hmac.compare_digest(am_token(am_key, job_id, am_attempt, expiry), presented):
        return "wrong AM token"
    if expiry < now_ms:
        return f"AM token expired {(now_ms - expiry) / 1000:.0f} s ago"
    return ""


def write_secret_file(path: Path, text: str) -> Path:
    """Write a secret to `path`, mode 0600 from the start (never briefly readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
