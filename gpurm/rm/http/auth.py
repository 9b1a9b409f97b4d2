"""Who asks over HTTP, decided by the same rules as gRPC (rm/security/identity.py, docs/security.md).

With mTLS (rm.yaml `tls:`) the server speaks HTTPS and demands a client certificate signed by the cluster CA: its
CN is the caller, and no header or cookie is read. Without mTLS (insecure mode) the caller is what the client
claims, unverified: the `X-Gpurm-User` header (as gRPC's `x-gpurm-user` metadata) or, for a browser, the
`gpurm_user` cookie the web UI's "view as" box sets; nobody claimed is `unknown`. Admin rights then need the RM's
own host (loopback), as over gRPC.
"""

from __future__ import annotations

from aiohttp import web

from gpurm.common import tls
from gpurm.rm.security.identity import Caller, address_is_local, caller_of
from gpurm.rm.state.messages import ErrorCode, RequestError

USER_HEADER = "X-Gpurm-User"
USER_COOKIE = "gpurm_user"


def who_asks(request: web.Request, mtls: bool) -> Caller:
    local = address_is_local(request.remote or "")
    if mtls:
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        name = tls.certificate_name(ssl_object.getpeercert()) if ssl_object is not None else None
        if name is None:       # the handshake demands a certificate; this is only a guard
            raise RequestError(ErrorCode.PERMISSION_DENIED, "no client certificate: present one signed by the "
                                                            "cluster CA (docs/security.md)")
        return caller_of(name, "", local)
    claimed = request.headers.get(USER_HEADER) or request.cookies.get(USER_COOKIE) or ""
    return caller_of(None, claimed.strip(), local)
