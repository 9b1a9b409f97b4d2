"""Who is calling the RM, from what a client cannot just claim.

With mTLS the client certificate's common name is the identity: `node:<id>` is an agent, `am:<name>` is an
AM process (which then proves its job with an AM token), anything else is a user. Without mTLS (insecure mode) a
user's name is only the client's claim (metadata `x-gpurm-user`); then the RM treats it as such: agents run
every job as one local user, and admin requests are taken only from the RM's own host (loopback). The exact rules
are in docs/security.md.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass
from typing import Any

from gpurm.common import tls
from gpurm.common.callers import AM_PREFIX, USER_KEY

MAX_USER = 64


class CallerKind(enum.Enum):
    USER = "user"
    NODE = "node"
    AM = "am"


@dataclass(frozen=True)
class Caller:
    name: str           # user name, node id or AM certificate name
    kind: CallerKind
    verified: bool      # from a certificate (mTLS), not a claim
    local: bool         # the connection comes from the RM's own host

    def describe(self) -> str:
        how = "certificate" if self.verified else "claimed, insecure mode"
        return f"{self.kind.value} {self.name} ({how}{', local' if self.local else ''})"


def metadata(context: Any, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return ""


@functools.lru_cache(maxsize=4096)
def peer_is_local(peer: str) -> bool:
    """Whether a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:...`) is this host's loopback."""
    if peer.startswith("unix:"):
        return True
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
    else:
        return False
    return address_is_local(host)


def address_is_local(host: str) -> bool:
    """Whether an IP address (`127.0.0.1`, `::1`, `::ffff:127.0.0.1`) is this host's loopback."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def identify(context: Any) -> Caller:
    """The caller of this RPC: the certificate's name when there is one, else the claimed user."""
    try:
        local = peer_is_local(context.peer() or "")
    except Exception:
        local = False
    return caller_of(tls.peer_name(context), metadata(context, USER_KEY), local)


def caller_of(name: str | None, claimed: str, local: bool) -> Caller:
    """The caller from a verified certificate name (None: no certificate) or, without one, the claimed user.
    gRPC (identify above) and HTTP (rm/http/auth.py) both decide here."""
    if name is not None:
        node = tls.node_of(name)
        if node is not None:
            return Caller(node[:128], CallerKind.NODE, True, local)
        if name.startswith(AM_PREFIX):
            return Caller(name[:128], CallerKind.AM, True, local)
        return Caller(name[:MAX_USER], CallerKind.USER, True, local)
    return Caller(claimed[:MAX_USER] or "unknown", CallerKind.USER, False, local)
