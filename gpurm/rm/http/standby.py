"""A standby RM's HTTP listener (rm.yaml `ha:`): until it leads, `http.listen` sends people and scripts to the
leader, as YARN's standby ResourceManager does with its web UI.

- GET and HEAD: 307 to the same path on the leader's web UI (its URL is in the lease row, rm/server/leadership.py);
- anything else, or while the leader's URL is not known: 503 with the leader named in the message and in the
  `X-Gpurm-Leader` header (a change is never replayed elsewhere behind the caller's back);
- `/metrics`: `gpurm_rm_leader 0`, so that Prometheus sees the standby up and can alert when no RM, or two, lead.

Nothing is read from the request but its method and path; bodies are refused beyond a few bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from gpurm.common.tls import TLSConfig
from gpurm.rm.http.server import SECURITY_HEADERS, listen
from gpurm.rm.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gpurm.rm.server.metrics import standby_metrics

LEADER_HEADER = "X-Gpurm-Leader"
# The web server's headers, with a CSP that allows nothing at all: a standby serves no page.
HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
           "Cache-Control": "no-store"}
MAX_BODY_BYTES = 1024

# (the leader's RM address, its web UI's URL); either may be "" (nobody leads, or its HTTP is not up yet).
LeaderFinder = Callable[[], tuple[str, str]]


def build_standby_app(leader: LeaderFinder) -> web.Application:
    metrics = standby_metrics()

    async def answer(request: web.Request) -> web.StreamResponse:
        address, url = leader()
        if request.path == "/metrics" and request.method in ("GET", "HEAD"):
            return web.Response(body=metrics, headers={"Content-Type": METRICS_CONTENT_TYPE, **HEADERS})
        headers = dict(HEADERS)
        if address:
            headers[LEADER_HEADER] = address
        if url and request.method in ("GET", "HEAD"):
            # The path is appended to the leader's own URL: the redirect never leaves the leader's host.
            headers["Location"] = url.rstrip("/") + request.path_qs
            return web.Response(status=307, headers=headers)
        if address:
            message = f"standby RM: the leader is {address}" + (f"; its web UI and REST API: {url}" if url else "")
        else:
            message = "standby RM: no RM leads right now; try again in a few seconds"
        return web.json_response({"error": {"code": "UNAVAILABLE", "message": message}}, status=503,
                                 headers=headers)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


class StandbyHttp:
    """The standby's listener on `http.listen` (the leader's own server takes the address over once it leads)."""

    def __init__(self, listen: str, tls: TLSConfig | None, leader: LeaderFinder) -> None:
        self.listen = listen
        self.tls = tls
        self.app = build_standby_app(leader)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self.runner, self.url = await listen(self.app, self.listen, self.tls, 0.5)
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

