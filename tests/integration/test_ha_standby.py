"""Leadership on a real PostgreSQL (rm/server/leadership.py, rm/server/standby.py): one RM leads; a standby answers
every call,
unary or streaming, with UNAVAILABLE naming the leader; when the leader stops renewing (as a SIGSTOPped one) the
standby takes over within the lease at a higher epoch, the old leader finds itself deposed, and its writes are
refused (fencing)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import psycopg
import pytest

from gpurm.common.limits import ServerLimits
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.server.leadership import Fenced, Lease, fence
from gpurm.rm.server.standby import LEADER_KEY, Leadership
from gpurm.rm.storage.postgres import IDLE_IN_TRANSACTION_MS, SESSION_OPTIONS
from gpurm.rm.storage.store import StoreWriteError, rows
from gpurm.rm.storage.url import open_store
from tests.conftest import free_port

LEASE_S = 2.0


def leadership(url: str, port: int) -> Leadership:
    address = f"127.0.0.1:{port}"
    return Leadership(url, address, address, LEASE_S, None, ServerLimits())


async def refused_by_standby(port: int) -> tuple[grpc.StatusCode, str, str]:
    """A unary call and a heartbeat stream to the standby: (code, leader named by the unary, by the stream)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await pbg.ClientStub(channel).ListJobs(pb.ListJobsRequest(), timeout=5)
        call = pbg.ResourceTrackerStub(channel).Heartbeat()
        await call.write(pb.NodeHeartbeat(node_id="n1"))
        with pytest.raises(grpc.aio.AioRpcError) as stream:
            await call.read()
    leaders = [dict(e.value.trailing_metadata() or ()).get(LEADER_KEY, "") for e in (unary, stream)]
    assert stream.value.code() is grpc.StatusCode.UNAVAILABLE
    return unary.value.code(), leaders[0], leaders[1]


async def test_a_standby_points_at_the_leader_and_takes_over_when_it_stops_renewing(pg_url: str) -> None:
    a, b = leadership(pg_url, free_port()), leadership(pg_url, free_port())
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await a.acquire(stop_a)
    keeping = asyncio.create_task(a.keep(stop_a))
    standing_by = asyncio.create_task(b.acquire(stop_b))
    try:
        code, by_unary, by_stream = await refused_by_standby(int(b.listen.rsplit(":", 1)[1]))
        assert code is grpc.StatusCode.UNAVAILABLE
        assert by_unary == by_stream == a.advertised
        await asyncio.sleep(LEASE_S)          # renewals keep the lead past a whole lease
        assert not standing_by.done() and not a.deposed

        keeping.cancel()                      # the leader stops renewing (paused, partitioned)
        stopped = time.monotonic()
        assert await asyncio.wait_for(standing_by, 3 * LEASE_S)
        assert time.monotonic() - stopped <= LEASE_S + 1.5
        assert b.term.epoch == a.term.epoch + 1

        # The old leader wakes up: by its own clock its lease may have run out, so it steps down without asking;
        # the lease is taken indeed (its renewal is refused), and so are its writes (fenced).
        old_epoch, holder = a.term.epoch, a.lease.holder if a.lease else ""
        await asyncio.wait_for(a.keep(stop_a), LEASE_S)
        assert a.deposed.startswith("the lease could not be renewed") and stop_a.is_set() and not a.term.leading
        assert a.lease is not None and not a.lease.renew(old_epoch)
        with psycopg.connect(pg_url) as conn, conn.transaction(), conn.cursor() as cur:
            with pytest.raises(Fenced):
                fence(cur, holder, old_epoch)
            fence(cur, b.lease.holder if b.lease else "", b.term.epoch)     # the new leader's writes pass
    finally:
        stop_b.set()
        keeping.cancel()
        await a.release()
        await b.release()


async def test_a_clean_stop_hands_the_lead_over_at_once(pg_url: str) -> None:
    a, b = leadership(pg_url, free_port()), leadership(pg_url, free_port())
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await a.acquire(stop_a)
    standing_by = asyncio.create_task(b.acquire(stop_b))
    try:
        await asyncio.sleep(0.3)
        assert not standing_by.done()
        released = time.monotonic()
        await a.release()
        assert await asyncio.wait_for(standing_by, LEASE_S)
        assert time.monotonic() - released < LEASE_S / 2     # not the lease's end: at the standby's next try
    finally:
        stop_b.set()
        await b.release()


def test_a_deposed_leaders_store_write_is_refused_and_commits_nothing(pg_url: str, tmp_path: Path) -> None:
    leases = [Lease(psycopg.connect(pg_url, autocommit=True), f"rm-{k}:7070", 60.0) for k in "ab"]
    stores = [open_store(pg_url, tmp_path / k, exclusive=False) for k in "ab"]
    try:
        leases[0].ensure_schema()
        epoch_a = leases[0].take()
        stores[0].fence_with(leases[0].holder, epoch_a)
        stores[0].write([rows([], [], [], {"written_by": "a"})])
        leases[0].release(epoch_a)                      # a takeover (here: a handed over; the same for a lapse)
        epoch_b = leases[1].take()
        assert epoch_b == epoch_a + 1
        stores[1].fence_with(leases[1].holder, epoch_b)
        with pytest.raises(StoreWriteError, match="no longer leads"):
            stores[0].write([rows([], [], [], {"written_by": "a, deposed"})])
        stores[1].write([rows([], [], [], {"also": "b"})])
        meta = stores[1].load_meta()
        assert meta["written_by"] == "a" and meta["also"] == "b"
    finally:
        for s in stores:
            s.close()
        for lease in leases:
            lease.conn.close()


def test_a_write_cut_off_before_its_commit_does_not_keep_the_standby_from_taking_over(pg_url: str) -> None:
    """A leader cut off mid-write leaves its transaction open on the server, holding the fence's lock on the lease
    row; the RM's sessions have idle_in_transaction_session_timeout, so the server rolls it back within seconds,
    not when TCP notices (hours), and the standby's take goes through."""
    leases = [Lease(psycopg.connect(pg_url, autocommit=True, options=SESSION_OPTIONS), f"rm-{k}:7070", 1.0)
              for k in "ab"]
    cut = psycopg.connect(pg_url, autocommit=True, options=SESSION_OPTIONS)   # the leader's writer
    try:
        leases[0].ensure_schema()
        epoch_a = leases[0].take()
        cut.execute("BEGIN")
        fence(cut.cursor(), leases[0].holder, epoch_a)           # ... and its COMMIT never arrives
        time.sleep(1.2)                                          # the lease has run out
        leases[1].conn.execute("SET lock_timeout = '30s'")       # without the timeout, this take would wait it out
        began = time.monotonic()
        assert leases[1].take() == epoch_a + 1
        waited = time.monotonic() - began
        assert 2.0 < waited < IDLE_IN_TRANSACTION_MS / 1000 + 5, waited   # it did wait, for the server's rollback
        with pytest.raises(psycopg.Error, match="idle-in-transaction"):   # the server ended the cut-off session
            cut.execute("COMMIT")
    finally:
        cut.close()
        for lease in leases:
            lease.conn.close()


def test_ha_status_says_who_leads_and_exits_1_when_nobody_does(pg_url: str) -> None:
    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpurm.cli.main", "admin", "ha", "status", *extra],
                              capture_output=True, text=True, timeout=60, check=False)

    nobody = status("--store", pg_url)
    assert nobody.returncode == 1 and "none (last: never)" in nobody.stdout, nobody.stdout + nobody.stderr
    lease = Lease(psycopg.connect(pg_url, autocommit=True), "rm-a.example:7070", 30.0)
    try:
        lease.ensure_schema()
        epoch = lease.take()
        assert "not serving HTTP yet" in status("--store", pg_url).stdout
        lease.set_http_url(epoch, "https://rm-a.example:8080")
        shown = status("--store", pg_url, "-o", "json")
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert data["leader"] == "rm-a.example:7070" and data["epoch"] == epoch and 0 < data["lease_left_s"] <= 30
        assert data["web_ui"] == "https://rm-a.example:8080"
        table = status("--store", pg_url).stdout
        assert "rm-a.example:7070" in table and f"epoch   {epoch}" in table
        assert "web UI  https://rm-a.example:8080" in table
        lease.release(epoch)
        after = status("--store", pg_url)
        assert after.returncode == 1 and "last: rm-a.example:7070" in after.stdout
    finally:
        lease.conn.close()
    bad = status("--store", "sqlite:///tmp/x.db")
    assert bad.returncode == 2 and "--store" in bad.stderr and "postgresql://" in bad.stderr
    down = status("--store", f"postgresql://gpurm@127.0.0.1:{free_port()}/gpurm")
    assert down.returncode == 2 and "cannot read the lease" in down.stderr


async def test_a_standby_sends_http_to_the_leaders_web_ui(pg_url: str) -> None:
    import aiohttp

    from gpurm.rm.http.standby import LEADER_HEADER

    a = leadership(pg_url, free_port())
    b_http = f"127.0.0.1:{free_port()}"
    b_port = free_port()
    b = Leadership(pg_url, f"127.0.0.1:{b_port}", f"127.0.0.1:{b_port}", LEASE_S, None, ServerLimits(), b_http)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await a.acquire(stop_a)
    keeping = asyncio.create_task(a.keep(stop_a))
    standing_by = asyncio.create_task(b.acquire(stop_b))
    base = f"http://{b_http}"
    try:
        async with aiohttp.ClientSession() as http:
            async def get(path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
                deadline = time.monotonic() + 10
                while True:
                    try:
                        async with http.request(method, base + path, allow_redirects=False,
                                                json={} if method == "POST" else None) as r:
                            return r.status, dict(r.headers), await r.text()
                    except aiohttp.ClientConnectorError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.1)

            # The leader's web UI is not named yet: 503, naming the leader's RM address.
            deadline = time.monotonic() + 5
            while True:
                status, headers, body = await get("/jobs")
                if headers.get(LEADER_HEADER) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert status == 503 and headers[LEADER_HEADER] == a.advertised and a.advertised in body

            await a.advertise_http("http://leader.example:8080")
            deadline = time.monotonic() + 5
            while status != 307 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                status, headers, body = await get("/jobs/job-7?x=1")
            assert status == 307 and headers["Location"] == "http://leader.example:8080/jobs/job-7?x=1"
            assert headers["X-Frame-Options"] == "DENY"
            # A change is never redirected: it is refused, naming where to go.
            status, headers, body = await get("/api/v1/jobs", "POST")
            assert status == 503 and "http://leader.example:8080" in json.loads(body)["error"]["message"]
            status, _, body = await get("/metrics")
            assert status == 200 and "gpurm_rm_leader 0" in body
    finally:
        keeping.cancel()
        stop_b.set()
        await asyncio.wait_for(standing_by, 5)
        await a.release()
        await b.release()
    assert not standing_by.result()
    # Once it stops standing by, the address is free again for its own web UI.
    host, port = b_http.rsplit(":", 1)
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))


def test_a_lease_row_of_an_older_version_gets_the_web_ui_column(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS rm_leader")
        conn.execute("CREATE TABLE rm_leader (id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, "
                     "address TEXT NOT NULL, epoch BIGINT NOT NULL, since TIMESTAMPTZ NOT NULL, "
                     "expires TIMESTAMPTZ NOT NULL)")
        conn.execute("INSERT INTO rm_leader VALUES (1, 'old', '10.0.0.1:7070', 4, now(), now())")
        lease = Lease(conn, "127.0.0.1:1", LEASE_S)
        lease.ensure_schema()
        info = lease.read()
        assert (info.address, info.epoch, info.http_url) == ("10.0.0.1:7070", 4, "")
        epoch = lease.take()                 # the old row's lease has run out
        assert epoch == 5
        lease.set_http_url(epoch, "https://rm-b:8080")
        assert lease.read().http_url == "https://rm-b:8080"
        assert lease.take() == 0
