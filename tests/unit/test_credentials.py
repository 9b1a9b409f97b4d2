"""rm/security/credentials.py: what the RM signs and remembers, with an injected clock."""

from __future__ import annotations

import pytest

from gpurm.common.model import Container, ContainerKind
from gpurm.common.tokens import JOIN_WINDOW_MS, ClusterKeys, TokenError, check_am_token, join_proof, verify_container
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.security.credentials import Credentials

KEYS = ClusterKeys(b"k" * 32)
NOW = 1_800_000_000.0


def learner(cid: str = "j1-c1", node: str = "n1") -> Container:
    return Container(cid, "j1", ContainerKind.LEARNER, node, [0, 1], 1, NOW, user="alice")


def join(creds: Credentials, node: str, at: float, instance: str = "i1") -> pb.RegisterNodeRequest:
    t_ms = round(at * 1000)
    return pb.RegisterNodeRequest(node_id=node, agent_instance=instance, join_time_ms=t_ms,
                                  join_proof=join_proof(KEYS.node_key(node).secret, node, instance, t_ms))


def test_a_container_token_is_good_on_its_node_alone_and_until_its_expiry() -> None:
    creds = Credentials(KEYS)
    token = creds.sign(learner(), 600, NOW)
    payload = verify_container(token, KEYS.node_key("n1"), node_id="n1", now_ms=round((NOW + 599) * 1000))
    assert (payload.container_id, list(payload.gpu_indices), payload.user) == ("j1-c1", [0, 1], "alice")
    with pytest.raises(TokenError):
        verify_container(token, KEYS.node_key("n2"), node_id="n2", now_ms=round(NOW * 1000))
    with pytest.raises(TokenError, match="expired"):
        verify_container(token, KEYS.node_key("n1"), node_id="n1", now_ms=round((NOW + 601) * 1000))


def test_a_container_token_says_whether_its_memory_follows_its_phases() -> None:
    creds = Credentials(KEYS)
    for flag in (False, True):
        token = creds.sign(learner(), 600, NOW, rightsize=flag)
        assert verify_container(token, KEYS.node_key("n1"), node_id="n1", now_ms=round(NOW * 1000)).rightsize is flag


def test_renewal_is_due_by_the_last_container_token_and_read_log_tokens_do_not_count() -> None:
    creds = Credentials(KEYS)
    assert creds.due_for_renewal("j1-c1", NOW)                  # never signed
    creds.sign(learner(), 600, NOW)
    assert not creds.due_for_renewal("j1-c1", NOW + 599) and creds.due_for_renewal("j1-c1", NOW + 601)
    creds.sign(learner(), 60, NOW + 550, pb.TOKEN_READ_LOG)     # a log token does not renew the container's
    assert creds.due_for_renewal("j1-c1", NOW + 601)
    creds.forget(lambda cid: cid != "j1-c1")
    assert creds.due_for_renewal("j1-c1", NOW)                  # forgotten: nothing signed on record


def test_a_join_proof_works_once_and_only_near_its_time() -> None:
    creds = Credentials(KEYS)
    request = join(creds, "n1", NOW)
    assert creds.check_join(request, NOW + 1) == ""
    assert "used before" in creds.check_join(request, NOW + 2)
    assert creds.check_join(join(creds, "n1", NOW, instance="i2"), NOW + 2) == ""   # a new agent instance
    late = join(creds, "n1", NOW + 10)
    assert "clock" in creds.check_join(late, NOW + 10 + JOIN_WINDOW_MS / 1000 + 1)
    forged = join(creds, "n2", NOW)
    forged.node_id = "n1"
    assert creds.check_join(forged, NOW) != ""


def test_old_join_proofs_are_pruned_from_memory() -> None:
    creds = Credentials(KEYS)
    for i in range(50):
        assert creds.check_join(join(creds, "n1", NOW, instance=f"i{i}"), NOW) == ""
    later = NOW + 3 * JOIN_WINDOW_MS / 1000
    assert creds.check_join(join(creds, "n1", later), later) == ""
    assert len(creds._joins) == 1


def test_an_am_token_is_renewed_past_half_its_life() -> None:
    creds = Credentials(KEYS)
    token = creds.am_token("j1", 2, 600, NOW)
    assert check_am_token(KEYS.am_key, "j1", 2, token, round(NOW * 1000)) == ""
    assert check_am_token(KEYS.am_key, "j1", 3, token, round(NOW * 1000)) != ""      # another AM attempt
    assert creds.renew_am_token("j1", 2, token, 600, NOW + 299) == ""
    renewed = creds.renew_am_token("j1", 2, token, 600, NOW + 301)
    assert renewed and check_am_token(KEYS.am_key, "j1", 2, renewed, round((NOW + 850) * 1000)) == ""
