"""Who calls the RM: certificates name users, nodes and AMs; without mTLS a name is only a claim."""

from __future__ import annotations

from typing import Any

import pytest

from gpurm.common.callers import USER_KEY
from gpurm.rm.security.identity import CallerKind, identify, peer_is_local


class Context:
    """The two things identify() reads from a gRPC call: the peer address and the auth context."""

    def __init__(self, peer: str, cn: str | None = None, claimed: str = "") -> None:
        self._peer, self._cn, self._claimed = peer, cn, claimed

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self._cn.encode()]} if self._cn else {}

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ((USER_KEY, self._claimed),) if self._claimed else ()


@pytest.mark.parametrize(("peer", "local"), [
    ("ipv4:127.0.0.1:5000", True), ("ipv4:127.8.9.1:1", True), ("ipv6:[::1]:5000", True),
    ("ipv6:[::ffff:127.0.0.1]:7", True), ("unix:/tmp/x.sock", True),
    ("ipv4:10.0.0.5:5000", False), ("ipv6:[fe80::1]:5000", False), ("ipv4:0.0.0.0:1", False), ("", False),
    ("ipv4:garbage", False), ("dns:localhost:1", False),
])
def test_loopback_peers_are_local(peer: str, local: bool) -> None:
    assert peer_is_local(peer) is local


def test_a_certificate_beats_any_claim() -> None:
    who = identify(Context("ipv4:10.0.0.5:1", cn="alice", claimed="root"))
    assert (who.name, who.kind, who.verified, who.local) == ("alice", CallerKind.USER, True, False)
    node = identify(Context("ipv4:10.0.0.5:1", cn="node:n7", claimed="root"))
    assert (node.name, node.kind) == ("n7", CallerKind.NODE)
    am = identify(Context("ipv4:10.0.0.5:1", cn="am:cluster"))
    assert (am.name, am.kind) == ("am:cluster", CallerKind.AM)


def test_without_a_certificate_the_name_is_only_a_claim() -> None:
    who = identify(Context("ipv4:10.0.0.5:1", claimed="root"))
    assert (who.name, who.verified, who.local) == ("root", False, False)
    assert "claimed" in who.describe()
    assert identify(Context("ipv4:127.0.0.1:1")).name == "unknown"
    assert len(identify(Context("ipv4:127.0.0.1:1", claimed="x" * 500)).name) == 64
