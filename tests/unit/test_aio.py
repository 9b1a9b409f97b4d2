"""gpurm/common/aio.py: waits and stops that never lose a cancellation (Python 3.11's asyncio.wait_for can)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from gpurm.common.aio import stop_task, stop_tasks, wait_set, within


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _cancel_as_it_completes(waits) -> bool:  # type: ignore[no-untyped-def]
    """Start a task that waits with `waits(event)` and then sleeps for an hour; set the event and cancel the task
    in one step of the loop (the race wait_for loses); whether the cancellation reached it."""
    event = asyncio.Event()

    async def body() -> None:
        await waits(event)
        await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await asyncio.sleep(0)          # it is waiting now
    event.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    if not task.done():             # lost: clean up for the next test
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return False
    return task.cancelled()


def test_wait_set_keeps_a_cancellation_that_arrives_as_the_event_is_set() -> None:
    assert run(_cancel_as_it_completes(lambda e: wait_set(e, 60)))


def test_within_keeps_a_cancellation_that_arrives_as_the_awaitable_completes() -> None:
    assert run(_cancel_as_it_completes(lambda e: within(e.wait(), 60)))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for loses the cancellation before 3.12 only")
def test_the_race_is_real_with_wait_for() -> None:
    # What the helpers are for: the same race loses the cancellation with asyncio.wait_for on 3.11.
    assert not run(_cancel_as_it_completes(lambda e: asyncio.wait_for(e.wait(), 60)))


def test_wait_set_says_whether_the_event_came() -> None:
    async def main() -> tuple[bool, bool, bool]:
        e = asyncio.Event()
        timed_out = await wait_set(e, 0.01)
        asyncio.get_running_loop().call_soon(e.set)
        came = await wait_set(e, 60)
        already = await wait_set(e, 0)
        return timed_out, came, already
    assert run(main()) == (False, True, True)


def test_within_times_out_with_timeout_error() -> None:
    async def main() -> None:
        await within(asyncio.Event().wait(), 0.01)
    with pytest.raises(TimeoutError):
        run(main())


def test_stop_task_ends_a_task_that_swallowed_its_first_cancellation() -> None:
    async def main() -> tuple[bool, bool, int]:
        swallowed = 0

        async def stubborn() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    swallowed += 1
                    if swallowed > 1:
                        raise           # the second cancellation ends it

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        ended = await stop_task(task, retry_s=0.01, give_up_s=5.0)
        return ended, task.cancelled(), swallowed
    assert run(main()) == (True, True, 2)


def test_stop_task_gives_up_on_a_task_that_never_ends_and_says_so() -> None:
    async def main() -> tuple[bool, bool]:
        release = asyncio.Event()

        async def immortal() -> None:
            while not release.is_set():
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    pass

        task = asyncio.create_task(immortal())
        await asyncio.sleep(0)
        ended = await stop_task(task, retry_s=0.01, give_up_s=0.05)
        still = not task.done()
        release.set()
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return ended, still
    assert run(main()) == (False, True)


def test_stop_task_drops_what_the_task_raised_and_accepts_none() -> None:
    async def main() -> tuple[bool, bool]:
        async def fails() -> None:
            raise RuntimeError("boom")
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        return await stop_task(task), await stop_task(None)
    assert run(main()) == (True, True)


def test_stop_tasks_stops_them_all_and_says_whether_they_ended() -> None:
    async def main() -> tuple[bool, list[bool]]:
        async def plain() -> None:
            await asyncio.sleep(3600)

        async def once_stubborn() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass                            # lost once: goes on as if nothing happened
            await asyncio.sleep(3600)

        tasks = [asyncio.create_task(plain()), asyncio.create_task(once_stubborn())]
        await asyncio.sleep(0)
        ended = await stop_tasks(tasks, retry_s=0.01, give_up_s=5.0)
        return ended, [t.cancelled() for t in tasks]
    assert run(main()) == (True, [True, True])
