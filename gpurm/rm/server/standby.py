"""A standby RM: until it takes the lead (rm/server/leadership.py) it answers every call on the RM's address with
UNAVAILABLE, naming the leader in the `x-gpurm-leader` trailer, so that clients given several RMs go to the
leader (gpurm/common/rmlist.py), and sends HTTP requests on `http.listen` to the leader's web UI (rm/http/standby.py);
then it stops answering and the RM starts for real on the same addresses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from gpurm.common import tls
from gpurm.common.aio import wait_set, within
from gpurm.common.limits import ServerLimits, make_server
from gpurm.common.rmlist import LEADER_KEY
from gpurm.common.tls import TLSConfig
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.http.standby import StandbyHttp
from gpurm.rm.server.leadership import Lease, Term, standby_try_every_s
from gpurm.rm.storage.store import StoreWriteError

log = logging.getLogger(__name__)



class StandbyAnswers(grpc.GenericRpcHandler):
    """Every RM method, whatever its shape, ends at once with UNAVAILABLE and the leader's address."""

    def __init__(self, leader: Callable[[], str]) -> None:
        self.leader = leader
        self.shapes: dict[str, tuple[bool, bool]] = {}
        for service in pb.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                self.shapes[f"/{service.full_name}/{m.name}"] = (m.client_streaming, m.server_streaming)

    async def _refuse(self, context: Any) -> None:
        address = self.leader()
        if address:
            context.set_trailing_metadata(((LEADER_KEY, address),))
        await context.abort(grpc.StatusCode.UNAVAILABLE,
                            f"standby RM: the leader is {address}" if address else
                            "standby RM: no RM leads right now; try again in a few seconds")

    def service(self, details: Any) -> Any:
        shape = self.shapes.get(details.method)
        if shape is None:
            return None

        async def unary(request: Any, context: Any) -> Any:
            await self._refuse(context)

        async def streaming(request: Any, context: Any) -> Any:
            await self._refuse(context)

        ident: Callable[[bytes], bytes] = bytes
        client_streaming, server_streaming = shape
        if client_streaming and server_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming, ident, ident)
        if server_streaming:
            return grpc.unary_stream_rpc_method_handler(streaming, ident, ident)
        if client_streaming:
            return grpc.stream_unary_rpc_method_handler(unary, ident, ident)
        return grpc.unary_unary_rpc_method_handler(unary, ident, ident)


async def wait_for_lead(lease: Lease, term: Term, address: str, tls_config: TLSConfig | None, limits: ServerLimits,
                        stop: asyncio.Event, http_listen: str = "") -> bool:
    """Serve as a standby on `address` (and on `http_listen`, unless "") until this RM takes the lease (True;
    `term` holds the epoch) or `stop` is set (False). A database that cannot be reached is retried: a standby has
    nothing to lose."""
    leader = ""
    leader_http = ""
    server = make_server(limits)
    server.add_generic_rpc_handlers((StandbyAnswers(lambda: leader),))
    if not tls.add_port(server, address, tls_config):
        raise OSError(f"cannot listen on {address}: address in use or not available")
    await server.start()
    web = StandbyHttp(http_listen, tls_config, lambda: (leader, leader_http)) if http_listen else None
    try:
        if web is not None:
            await web.start()
    except OSError:
        await server.stop(grace=0)
        raise
    log.info("standby on %s%s: waiting to take the lead", address, f" and {web.url}" if web is not None else "")
    every = standby_try_every_s(term.ttl_s)
    try:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                epoch = await asyncio.to_thread(lease.take)
                if epoch:
                    term.took(epoch, sent)
                    return True
                info = await asyncio.to_thread(lease.read)
                if info.address != leader:
                    log.info("the leader is %s (epoch %d)", info.address or "nobody", info.epoch)
                leader = info.address if info.held else ""
                leader_http = info.http_url if info.held else ""
            except Exception as exc:     # the database is down or unreachable: keep trying
                log.warning("standby: the store's database: %s", exc)
                leader = leader_http = ""
            await wait_set(stop, every)
        return False
    finally:
        if web is not None:
            await web.stop()
        await server.stop(grace=0)


class Leadership:
    """This RM's part in a highly available set (rm.yaml `ha:`): stand by until it leads, then keep the lease.
    When it cannot (a standby took over, or renewals failed for most of a lease) it is `deposed`: the RM stops
    (exit 3) and its supervisor starts it again, as a standby."""

    def __init__(self, url: str, advertised: str, listen: str, lease_s: float, tls_config: TLSConfig | None,
                 limits: ServerLimits, http_listen: str = "") -> None:
        self.url = url
        self.listen = listen
        self.http_listen = http_listen    # "" without HTTP
        self.tls_config = tls_config
        self.limits = limits
        self.term = Term(lease_s)
        self.lease: Lease | None = None
        self.advertised = advertised
        self.deposed = ""              # why this RM stopped leading, once it did

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Stand by until this RM leads (True) or `stop` is set (False)."""
        import psycopg

        from gpurm.rm.storage.postgres import SESSION_OPTIONS

        url = self.url
        try:
            conn = await asyncio.to_thread(lambda: psycopg.connect(url, autocommit=True, connect_timeout=10,
                                                                   options=SESSION_OPTIONS))
            self.lease = Lease(conn, self.advertised, self.term.ttl_s)
            await asyncio.to_thread(self.lease.ensure_schema)
        except psycopg.Error as exc:
            detail = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise StoreWriteError(f"the lease in the store's database cannot be read: {detail}") from None
        return await wait_for_lead(self.lease, self.term, self.listen, self.tls_config, self.limits, stop,
                                   self.http_listen)

    async def advertise_http(self, url: str) -> None:
        """Put this leader's web UI in the lease row, where standbys send HTTP requests (best effort: without it
        they answer 503 naming the leader instead of redirecting)."""
        assert self.lease is not None
        try:
            await asyncio.to_thread(self.lease.set_http_url, self.term.epoch, url)
        except Exception as exc:
            log.warning("could not name the web UI in the lease row: %s", exc)

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew the lease every third of it; set `deposed` and `stop` when the lead is lost."""
        assert self.lease is not None
        lease = self.lease
        while not stop.is_set():
            now = time.monotonic()
            if self.term.must_step_down(now):
                self._depose(stop, f"the lease could not be renewed for {now - self.term.renewed_at:.1f}s")
                return
            if self.term.renew_due(now):
                try:
                    # Never waited on past the step-down moment: a renewal hung on a cut-off database must not
                    # keep this RM leading after a standby may have taken the lease.
                    wait_s = max(0.01, min(self.term.ttl_s / 3, self.term.step_down_in(now)))
                    held = await within(asyncio.to_thread(lease.renew, self.term.epoch), wait_s)
                except Exception as exc:     # the database is slow or gone: try again until the margin
                    log.warning("lease renewal failed: %s", exc or type(exc).__name__)
                else:
                    if not held:
                        self._depose(stop, "another RM holds the lease")
                        return
                    self.term.renewed(now)
            pause = min(0.2, self.term.ttl_s / 10)
            if self.term.leading:
                pause = min(pause, self.term.step_down_in(time.monotonic()))
            await asyncio.sleep(pause)

    def _depose(self, stop: asyncio.Event, why: str) -> None:
        self.deposed = why
        log.error("no longer the leader (epoch %d): %s; stopping (a supervisor restarts this RM as a standby)",
                  self.term.epoch, why)
        self.term.lost()
        stop.set()

    async def release(self) -> None:
        """A clean stop: hand the lease back so a standby takes over at once."""
        if self.lease is None:
            return
        try:
            if self.term.leading:
                await asyncio.to_thread(self.lease.release, self.term.epoch)
                log.info("lease released (epoch %d)", self.term.epoch)
        except Exception as exc:
            log.warning("could not release the lease: %s; a standby takes over when it runs out", exc)
        finally:
            await asyncio.to_thread(self.lease.conn.close)
