"""Per-node keys, join proofs, container tokens (purpose, expiry) and AM tokens."""

from __future__ import annotations

import pytest

from gpurm.common.tokens import (
    JOIN_WINDOW_MS,
    ClusterKeys,
    TokenError,
    am_token,
    check_am_token,
    join_proof,
    parse_node_secret,
    sign_container,
    verify_container,
)
from gpurm.proto import gpurm_pb2 as pb

KEYS = ClusterKeys(b"s" * 32)
NOW = 1_800_000_000_000


def payload(node: str = "n1", purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER, expiry: int = NOW + 60_000,
            cid: str = "c1") -> pb.ContainerTokenPayload:
    return pb.ContainerTokenPayload(container_id=cid, job_id="job-1", node_id=node, user="alice",
                                    expiry_ms=expiry, purpose=purpose)


def test_node_keys_differ_per_node_and_from_the_am_key() -> None:
    keys = {KEYS.node_key(n).secret for n in ("n1", "n2", "n10", "n1 ")}
    assert len(keys) == 4
    assert KEYS.am_key not in keys
    assert ClusterKeys(b"t" * 32).node_key("n1") != KEYS.node_key("n1")


def test_a_node_key_mints_tokens_for_its_own_node_only() -> None:
    stolen = KEYS.node_key("n1")
    forged = sign_container(payload(node="n2"), stolen)
    with pytest.raises(TokenError, match="bad token signature"):
        verify_container(forged, KEYS.node_key("n2"), node_id="n2", now_ms=NOW)
    good = sign_container(payload(), stolen)
    assert verify_container(good, KEYS.node_key("n1"), node_id="n1", now_ms=NOW).container_id == "c1"
    with pytest.raises(TokenError, match="not n2"):
        verify_container(good, KEYS.node_key("n1"), node_id="n2", now_ms=NOW)


@pytest.mark.parametrize(("token_payload", "purpose", "message"), [
    (payload(purpose=pb.TOKEN_READ_LOG), pb.TOKEN_CONTAINER, "TOKEN_READ_LOG, not TOKEN_CONTAINER"),
    (payload(), pb.TOKEN_READ_LOG, "TOKEN_CONTAINER, not TOKEN_READ_LOG"),
    (payload(purpose=pb.TOKEN_PURPOSE_UNSPECIFIED), pb.TOKEN_CONTAINER, "TOKEN_PURPOSE_UNSPECIFIED"),
    (payload(expiry=NOW - 5000), pb.TOKEN_CONTAINER, "expired 5 s ago"),
    (payload(expiry=0), pb.TOKEN_CONTAINER, "no expiry"),
])
def test_container_tokens_are_for_one_purpose_and_expire(token_payload: pb.ContainerTokenPayload,
                                                         purpose: pb.TokenPurpose, message: str) -> None:
    key = KEYS.node_key("n1")
    with pytest.raises(TokenError, match=message):
        verify_container(sign_container(token_payload, key), key, node_id="n1", now_ms=NOW, purpose=purpose)


def test_join_proofs_prove_the_node_secret_within_a_window() -> None:
    secret = KEYS.node_key("n1").secret
    proof = join_proof(secret, "n1", "inst-1", NOW)
    assert KEYS.check_join("n1", "inst-1", NOW, proof, NOW + 1000) == ""
    assert "does not match" in KEYS.check_join("n2", "inst-1", NOW, proof, NOW)
    assert "does not match" in KEYS.check_join("n1", "inst-2", NOW, proof, NOW)
    assert "does not match" in KEYS.check_join("n1", "inst-1", NOW + 1, proof, NOW)
    assert "minutes from the RM's clock" in KEYS.check_join("n1", "inst-1", NOW, proof, NOW + JOIN_WINDOW_MS + 1)
    assert "no join proof" in KEYS.check_join("n1", "inst-1", NOW, b"", NOW)
    other = join_proof(KEYS.node_key("n2").secret, "n1", "inst-1", NOW)
    assert "does not match" in KEYS.check_join("n1", "inst-1", NOW, other, NOW)


def test_am_tokens_bind_job_attempt_and_expiry() -> None:
    token = am_token(KEYS.am_key, "job-1", 2, NOW + 60_000)
    assert check_am_token(KEYS.am_key, "job-1", 2, token, NOW) == ""
    assert check_am_token(KEYS.am_key, "job-1", 3, token, NOW) == "wrong AM token"
    assert check_am_token(KEYS.am_key, "job-2", 2, token, NOW) == "wrong AM token"
    assert "expired" in check_am_token(KEYS.am_key, "job-1", 2, token, NOW + 61_000)
    # a node's key makes no AM token
    assert check_am_token(KEYS.am_key, "job-1", 2, am_token(KEYS.node_key("n1").secret, "job-1", 2, NOW + 60_000),
                          NOW) == "wrong AM token"
    # the expiry is part of what is signed: moving it forward breaks the token
    _, _, mac = token.rpartition(".")
    assert check_am_token(KEYS.am_key, "job-1", 2, f"v1.{NOW + 10**9}.{mac}", NOW) == "wrong AM token"
    for bad in ("", "v1", "v1.x.y", "v2.1.ab", "v1.1.2.3", "x" * 5000):
        assert check_am_token(KEYS.am_key, "job-1", 2, bad, NOW) in ("missing AM token", "malformed AM token")


def test_node_secrets_parse_from_hex_only() -> None:
    key = KEYS.node_key("n1")
    assert parse_node_secret(key.secret.hex() + "\n") == key
    for bad, why in (("zz", "not a hex"), ("ab" * 5, "5 bytes")):
        with pytest.raises(ValueError, match=why):
            parse_node_secret(bad)
