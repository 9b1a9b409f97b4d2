"""asyncio waits and stops that never lose a cancellation.

Python 3.11's `asyncio.wait_for` returns the result instead of raising when a cancellation arrives just as the
future it waits on completes (CPython gh-86296, fixed in 3.12). A loop that waits with it for an event that
another task sets (a wake-up, a drained queue) then carries on as if it had never been cancelled, and whatever
awaits its end hangs: an RM stopped right after it started outran its shutdown watchdog (exit 1) this way, its
MQTT publisher still connecting. `asyncio.timeout` keeps count of cancellations and loses none, so the waits here
use it; aiomqtt still waits with `wait_for` inside its connect, so `stop_task` cancels again until the task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

STOP_RETRY_S = 0.2     # how often stop_task cancels again a task that did not end
STOP_GIVE_UP_S = 5.0   # ... and when it stops waiting for it


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passed; whether it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def within(aw: Awaitable[T], timeout_s: float) -> T:
    """`aw`'s result, or TimeoutError after `timeout_s` (asyncio.wait_for without the lost cancellation)."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def stop_task(task: asyncio.Task[Any] | None, retry_s: float = STOP_RETRY_S,
                    give_up_s: float = STOP_GIVE_UP_S) -> bool:
    """Cancel `task` and wait for it to end, cancelling it again every `retry_s` in case a cancellation was lost
    (see above); whether it ended within `give_up_s` (if not, it is logged and left cancelled). Whatever it
    raised is dropped: a task being stopped has nobody left to report to."""
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    while not task.done():
        task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            log.warning("task %s did not end %.1f s after it was cancelled; leaving it", task.get_name(), give_up_s)
            return False
        await asyncio.wait({task}, timeout=min(retry_s, left))
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()       # retrieved: no "exception was never retrieved" at exit
    return True


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], retry_s: float = STOP_RETRY_S,
                     give_up_s: float = STOP_GIVE_UP_S) -> bool:
    """`stop_task` on each of `tasks` at once; whether they all ended."""
    results = await asyncio.gather(*(stop_task(t, retry_s, give_up_s) for t in tasks))
    return all(results)
