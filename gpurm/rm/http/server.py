"""The HTTP server in the RM's own event loop (aiohttp): the REST API (api.py), the web UI (pages.py, static/),
and what every route shares: who asks (auth.py), JSON errors, body size limits, security headers.

Errors are JSON `{"error": {"code": ..., "message": ...}}` with the message the CLI would print and an HTTP status
(ERROR_STATUS); an unexpected exception is logged and answered 500, never fatal. Other routes (e.g. `/metrics`)
mount through `extra`: callables given the aiohttp application and the RM shell before the server starts.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gpurm.common import tls as tlsmod
from gpurm.common.fields import ConfigError, parse_address
from gpurm.common.tls import TLSConfig
from gpurm.rm.config import HTTPConfig
from gpurm.rm.http import api, pages
from gpurm.rm.http.api import CALLER, MTLS, SHELL
from gpurm.rm.http.auth import who_asks
from gpurm.rm.security.identity import address_is_local
from gpurm.rm.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gpurm.rm.server.service import status_details
from gpurm.rm.state.messages import ErrorCode, RequestError

if TYPE_CHECKING:
    from gpurm.rm.server.daemon import RMShell

log = logging.getLogger(__name__)

RouteHook = Callable[[web.Application, "RMShell"], None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ERROR_STATUS = {
    ErrorCode.INVALID_ARGUMENT: 400, ErrorCode.PERMISSION_DENIED: 403, ErrorCode.NOT_FOUND: 404,
    ErrorCode.FAILED_PRECONDITION: 409, ErrorCode.UNAVAILABLE: 503,
}
HTTP_CODES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
              409: "FAILED_PRECONDITION", 413: "PAYLOAD_TOO_LARGE", 415: "UNSUPPORTED_MEDIA_TYPE",
              500: "INTERNAL", 503: "UNAVAILABLE"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# On every answer (the CSP above is for the pages; a response may set its own Cache-Control).
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                    "Referrer-Policy": "no-referrer"}
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def error_response(status: int, message: str, code: str = "") -> web.Response:
    body = {"error": {"code": code or HTTP_CODES.get(status, "ERROR"), "message": message}}
    return web.json_response(body, status=status)


def _cross_site(request: web.Request) -> str:
    """Why a mutating request looks forged by another site ("" = it does not): browsers send a form to any
    origin without asking, so a change needs a JSON body (which makes a browser ask first, and we never allow
    it) and no foreign Origin."""
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        return f"Origin {origin[:100]} is not this server; requests that change things come from its own pages"
    if request.content_type != "application/json":
        return "Content-Type: must be application/json for requests that change things"
    return ""


LOOPBACK_NAMES = ("localhost", "localhost.")
LOCAL_ONLY: web.AppKey[bool] = web.AppKey("local_only")


def _foreign_host(request: web.Request) -> str:
    """On a loopback listener, a Host that is not a loopback name: a page of another site whose name now resolves
    to 127.0.0.1 (DNS rebinding) would otherwise read the API as if it were this server's own."""
    host = (request.url.host or "").strip("[]").lower()
    if host in LOOPBACK_NAMES or address_is_local(host):
        return ""
    return f"Host {host[:100]!r} is not this server's (it serves loopback only: use 127.0.0.1 or localhost)"


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who asks, cross-site checks, errors as JSON, and the security headers on every answer."""
    try:
        if request.app[LOCAL_ONLY]:
            foreign = _foreign_host(request)
            if foreign:
                raise web.HTTPForbidden(text=foreign)
        routed = getattr(request.match_info, "http_exception", None) is None    # 404 / 405 say so first
        if request.method in MUTATING and routed:
            why = _cross_site(request)
            if why:
                raise web.HTTPUnsupportedMediaType(text=why) if why.startswith("Content-Type") \
                    else web.HTTPForbidden(text=why)
        request[CALLER] = who_asks(request, request.app[MTLS])
        response = await handler(request)
    except RequestError as exc:
        response = error_response(ERROR_STATUS.get(exc.code, 400), status_details(exc.message), exc.code.name)
    except ConfigError as exc:
        response = error_response(400, status_details(*exc.problems), "INVALID_ARGUMENT")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text or exc.reason
        if exc.status in (404, 405) and message.startswith(str(exc.status)):     # aiohttp's own "404: Not Found"
            message = (f"no such route: {request.method} {request.path[:200]}"
                       + (f" (the API: {api.PREFIX}/openapi.json)" if request.path.startswith("/api/") else ""))
        response = error_response(exc.status, message)
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]     # RFC 9110: a 405 names the methods served
    except Exception as exc:
        log.exception("HTTP %s %s failed", request.method, request.path[:200])
        response = error_response(500, f"internal error in the RM ({type(exc).__name__}); see the RM log")
    if isinstance(response, web.Response) and response.status >= 400 and not request.path.startswith("/api/") \
            and response.content_type == "application/json":
        response = pages.error_page(request, response)
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("Cache-Control", "no-store")
    return response


async def prometheus_metrics(request: web.Request) -> web.Response:
    """The RM's metrics for Prometheus (gpurm/rm/server/metrics.py, docs/metrics.md): any caller the middleware admits
    (under mTLS, a certificate of the cluster's CA) may scrape them; they hold sums, not jobs' contents."""
    shell = request.app[SHELL]
    return web.Response(body=shell.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


def build_app(shell: RMShell, config: HTTPConfig, mtls: bool, extra: Iterable[RouteHook] = ()) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=config.max_body_bytes)
    app[SHELL] = shell
    app[MTLS] = mtls
    app[api.MAX_BODY] = config.max_body_bytes
    host = parse_address(config.listen)[0].lower()
    app[LOCAL_ONLY] = host in LOOPBACK_NAMES or address_is_local(host)
    api.register(app)
    pages.register(app)
    app.router.add_get("/metrics", prometheus_metrics)
    for hook in extra:
        hook(app, shell)
    return app


class QuietBadRequests(logging.Filter):
    """aiohttp logs a traceback at ERROR for every malformed request it answers 400 itself: a client could fill
    the RM's log with them. Such a request becomes one DEBUG line; anything else passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.debug("bad HTTP request answered %s: %s", exc.code, str(exc.message).splitlines()[0][:200])
            return False
        return True


QUIET = QuietBadRequests()


async def listen(app: web.Application, address: str, tls: TLSConfig | None,
                 shutdown_timeout_s: float) -> tuple[web.AppRunner, str]:
    """Serve `app` on `address` (HTTPS under mTLS): its runner and URL (the host's name for a wildcard address).
    OSError naming http.listen when the address is taken."""
    host, port = parse_address(address)
    ssl_context = tlsmod.server_ssl_context(tls) if tls is not None else None
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=128)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {address} (http.listen): {exc.strerror or exc}; "
                      "choose another port, or http.enabled: false") from None
    bound: Any = runner.addresses[0]
    shown = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return runner, f"{'https' if tls else 'http'}://{shown}:{bound[1]}"


class HttpServer:
    def __init__(self, shell: RMShell, config: HTTPConfig, tls: TLSConfig | None,
                 extra: Iterable[RouteHook] = ()) -> None:
        self.config = config
        self.tls = tls
        self.app = build_app(shell, config, tls is not None, extra)
        self.runner: web.AppRunner | None = None
        self.url = ""
        logging.getLogger("aiohttp.server").addFilter(QUIET)     # the same object each time: added once

    async def start(self) -> str:
        """Listen on `http.listen`; returns the URL. OSError naming http.listen when the address is taken."""
        self.runner, self.url = await listen(self.app, self.config.listen, self.tls, 1.0)
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
