"""The RM's start-up steps that stand on their own: the epoch of this start, the listen addresses checked before
anything starts, the heap settled after the store is loaded, the backup at start, the gRPC server with its four
services bound, the HTTP server (web UI, REST API), and the pidfile that says where the RM serves.

The sequence itself, and the stop in reverse, stay in RMShell.run (rm/server/daemon.py): their order is the RM's
contract (nothing is served before the store is loaded; the store closes last).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from gpurm.common import tls
from gpurm.common.fields import ConfigError, parse_address
from gpurm.common.limits import make_server
from gpurm.common.netcheck import listen_problem
from gpurm.common.tokens import write_secret_file
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.config import RMConfig
from gpurm.rm.server.service import AdminService, AMService, ClientService, DecodeGuard, TrackerService
from gpurm.rm.storage.statedir import rotate_backup
from gpurm.rm.storage.store import RMStore, SqliteStore

if TYPE_CHECKING:
    from gpurm.rm.http.server import HttpServer
    from gpurm.rm.server.daemon import RMShell

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line

# Allocations between young collections, and young / middle collections between older ones (CPython's defaults,
# 700 / 10 / 10, suit small heaps): a full collection at most every 40M allocations, minutes apart under load.
GC_THRESHOLDS = (20_000, 20, 100)
FRESH_EPOCHS = 2 ** 40       # a new state dir's first epoch is drawn below this (int64 leaves room for restarts)
SWITCH_INTERVAL_S = 0.0005    # how often the loop hands the GIL to a waiting thread (the store writer)


def bump_epoch(path: Path) -> int:
    """The RM's epoch: one more than the last start's, written (fsync) before the RM serves anything, so views
    from this start never compare with an older start's by version alone. A new state dir starts from a random
    epoch: RMs with different state dirs sharing a broker (another cluster, a standby, a store started afresh)
    never publish views of one epoch, whose versions an AM would compare (a retained view of another cluster with
    a higher version once replaced an AM's own, which then ignored its RM's deltas)."""
    try:
        last = int(path.read_text().strip() or "0")
    except FileNotFoundError:
        last = secrets.randbelow(FRESH_EPOCHS)
    except ValueError:
        raise ConfigError([f"{path}: not an epoch number; delete the file (the RM starts a new epoch)"]) from None
    epoch = last + 1
    write_secret_file(path, str(epoch))     # 0600, fsynced, replaced atomically (not secret, but private)
    return epoch


def check_listen(config: RMConfig) -> None:
    """OSError saying why when the gRPC address, or the HTTP one (when on), cannot be listened on."""
    problem = listen_problem(config.listen)
    if problem:
        raise OSError(f"cannot listen on {config.listen}: {problem}")
    problem = listen_problem(config.http.listen) if config.http.enabled else ""
    if problem:
        raise OSError(f"cannot listen on {config.http.listen} (http.listen): {problem}; choose another "
                      "port, or http.enabled: false")


def settle_heap() -> None:
    """After loading the store: move what was loaded out of the cyclic collector's sight, and collect less
    often. A full collection walks every tracked object: with 10,000 nodes and their records that stalled the
    event loop for hundreds of milliseconds at a time (every heartbeat waited). The records are not garbage; what
    the RM allocates per request is short-lived and freed by reference counting."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    # The store's writer thread (rm/storage/writer.py) needs the GIL back after each SQLite call, and a busy event
    # loop gives it up only every switch interval: at the default 5 ms a commit waited 25 ms at 10,000 nodes.
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def backup_at_start(store: RMStore, config: RMConfig) -> None:
    """The automatic backup at start is SQLite's (its online backup API); a PostgreSQL store is backed up with
    `gpurm admin store backup --url` (pg_dump) on the operator's schedule (docs/operations.md)."""
    kept = rotate_backup(store, config.state_dir, config.store_backups) if isinstance(store, SqliteStore) else None
    if kept is not None:
        log.info("store backed up to %s (keeping the last %d)", kept, config.store_backups)


def grpc_server(shell: RMShell, config: RMConfig) -> tuple[grpc.aio.Server, str, int]:
    """The gRPC server with the Client, Admin, ApplicationMaster and ResourceTracker services, bound to
    `config.listen` (not started): the server, the host and the port bound. OSError when it cannot bind."""
    server = make_server(config.limits, [DecodeGuard()])
    pbg.add_ClientServicer_to_server(ClientService(shell), server)
    pbg.add_AdminServicer_to_server(AdminService(shell), server)
    pbg.add_ApplicationMasterServicer_to_server(AMService(shell), server)
    pbg.add_ResourceTrackerServicer_to_server(TrackerService(shell), server)
    host, port = parse_address(config.listen)
    try:
        bound = tls.add_port(server, f"{host}:{port}", config.tls)
    except RuntimeError:
        bound = 0
    if not bound:
        raise OSError(f"cannot listen on {config.listen}: address in use or not available")
    return server, host, bound


async def start_http(shell: RMShell, config: RMConfig, routes: list[Callable[[Any, RMShell], None]]
                     ) -> tuple[HttpServer | None, str]:
    """The web UI and REST API in this event loop (rm.yaml `http:`), serving: the server and its URL; (None, "")
    when turned off. OSError when its address is taken."""
    if not config.http.enabled:
        log.info("HTTP (web UI, REST API) off: http.enabled is false")
        return None, ""
    from gpurm.rm.http.server import HttpServer

    web = HttpServer(shell, config.http, config.tls, extra=routes)
    url = await web.start()
    log.info("web UI and REST API on %s", url)
    return web, url


def write_pidfile(state_dir: Path, address: str, mqtt_url: str, http_url: str) -> None:
    """STATE_DIR/rm.json: this process and where it serves (gRPC, MQTT, HTTP), replaced atomically."""
    path = state_dir / "rm.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "address": address, "mqtt_url": mqtt_url,
                               "http_url": http_url}))
    os.replace(tmp, path)
