"""The RM as a process: its event loop, its signals (SIGTERM / SIGINT stop it, SIGHUP rereads the queue config),
the watchdog that ends a stop that hangs, and its exit codes. The daemon itself is rm/server/daemon.py's RMShell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Coroutine
from typing import Any

from gpurm.common.fields import ConfigError
from gpurm.rm.config import RMConfig
from gpurm.rm.server.daemon import RMShell
from gpurm.rm.state.messages import RequestError
from gpurm.rm.storage.statedir import StateDirBusy, StateDirLock
from gpurm.rm.storage.store import StoreDamaged, StoreWriteError

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the RM's event loop: uvloop's where installed (a dependency on Linux; its callbacks, futures and
    timers cost a fraction of asyncio's, and every gRPC message goes through several), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def run_rm(config: RMConfig) -> int:
    """Run the RM until SIGTERM or SIGINT. Returns the exit code: 0 after a clean stop, 2 when it cannot start
    (one line in the log says why), 1 when a stop outran `shutdown.timeout` and the RM exited hard, 3 when it
    stopped because it no longer leads (rm.yaml `ha:`; its supervisor starts it again, as a standby)."""
    os.umask(0o077)          # the store, key and pidfile are the RM's alone
    lock = StateDirLock(config.state_dir)
    watchdog = ShutdownWatchdog(config.shutdown_timeout_s)
    deposed = ""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if not stop.is_set():
                log.info("%s: stopping (in-flight requests get %.1f s; exit within %.1f s)", sig.name,
                         config.shutdown_grace_s, config.shutdown_timeout_s)
            stop.set()
            watchdog.arm(sig.name)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        shell = RMShell(config)
        loop.add_signal_handler(signal.SIGHUP, lambda: shell._spawn(_refresh_on_sighup(shell)))
        await shell.run(stop)
        if shell.leadership is not None and shell.leadership.deposed:
            nonlocal deposed
            deposed = shell.leadership.deposed

    try:
        lock.acquire()
        run_loop(main())
    except (OSError, StateDirBusy, StoreDamaged, StoreWriteError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    except ConfigError as exc:
        log.error("cannot start: %s", "; ".join(exc.problems))
        return 2
    finally:
        watchdog.disarm()
        lock.release()
    if deposed:
        log.warning("RM stopped: no longer the leader (%s)", deposed)
        return 3
    log.info("RM stopped")
    return 0


class ShutdownWatchdog:
    """Ends the process `timeout_s` after a stop signal, whatever still hangs (a stuck stream, a dependency that
    does not answer, a worker thread): a thread, so it fires even when the event loop is blocked."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._timer: threading.Timer | None = None

    def arm(self, why: str) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.timeout_s, self._fire, args=(why,))
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self, why: str) -> None:
        log.error("RM did not stop within %.1f s of %s (shutdown.timeout); exiting now", self.timeout_s, why)
        logging.shutdown()
        os._exit(1)


async def _refresh_on_sighup(shell: RMShell) -> None:
    try:
        reply = await shell.refresh_queues("")
    except RequestError as exc:
        log.error("SIGHUP: queue config not applied: %s", exc.message)
        return
    if not reply.applied:
        log.error("SIGHUP: queue config not applied: %s", "; ".join(reply.errors))
