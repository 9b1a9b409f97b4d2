"""The AM's calls to the RM across an RM list (grpc.aio): a standby's hint, a dead RM, a back-off per whole round.
No sockets, no sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from gpurm.common.retry import RetryPolicy
from gpurm.common.rmlist import LEADER_KEY, Channels


def aio_failure(details: str, trailer: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(*trailer),
                                details)


def test_the_am_follows_a_standby_to_the_leader_without_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurm.am import runner as runner_module
    from gpurm.am.runner import AMRunner

    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(runner_module.asyncio, "sleep", no_sleep)
    am = AMRunner("a:1,b:1,c:1", "job-1", 1, "token")
    calls: list[str] = []
    behaviour: dict[str, Any] = {
        "a:1": aio_failure("standby: the leader is c:1", ((LEADER_KEY, "c:1"),)),
        "b:1": aio_failure("failed to connect to all addresses"),
        "c:1": "registered"}

    class Stub:
        def __init__(self, address: str) -> None:
            self.address = address

        async def Register(self) -> Any:
            calls.append(self.address)
            what = behaviour[self.address]
            if isinstance(what, Exception):
                raise what
            return what

    am.channels = Channels(am.follower, lambda a: a)
    stub = am.channels.stub(Stub)
    assert asyncio.run(am._rm_call("register", stub.Register)) == "registered"
    assert calls == ["a:1", "c:1"] and slept == []
    # The leader goes away and nothing answers: a whole round, then the shared back-off.
    behaviour["c:1"] = aio_failure("failed to connect to all addresses")
    behaviour["a:1"] = aio_failure("standby; no leader yet")
    am.retry = RetryPolicy(0.2, 5.0, 0.0)     # never give up: stop it by answering
    answers = iter([None, None, None, None, None, None, "allocated"])

    async def allocate() -> Any:
        calls.append(am.follower.current)
        answer = next(answers)
        if answer is None:
            raise behaviour[am.follower.current]
        return answer

    del calls[:]
    assert asyncio.run(am._rm_call("allocate", allocate)) == "allocated"
    assert calls == ["c:1", "a:1", "b:1", "c:1", "a:1", "b:1", "c:1"] and len(slept) == 2   # a sleep per round
