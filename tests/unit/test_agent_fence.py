"""The agent's fence (nodeagent/fence.py) on a scripted clock and a recording supervisor: no processes, no sockets,
no sleeps. The real partition is tests/integration/test_fence_netns.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gpurm.nodeagent.fence import Fence
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb


class Recorder:
    """What the fence asks of a supervisor: its records, and stops."""

    def __init__(self, *states: int) -> None:
        self.recs = [ContainerRecord(f"c{i}", "job-1", pb.CONTAINER_LEARNER, s, [i]) for i, s in enumerate(states)]
        self.stops: list[tuple[str, float, str]] = []

    def records(self) -> list[ContainerRecord]:
        return self.recs

    async def stop(self, cid: str, grace_s: float, reason: str) -> ContainerRecord:
        self.stops.append((cid, grace_s, reason))
        return next(r for r in self.recs if r.container_id == cid)


def fence_on(sup: Recorder, now: list[float], wall: list[float] | None = None, state: Path | None = None) -> Fence:
    any_sup: Any = sup
    return Fence(any_sup, clock=lambda: now[0], state_file=state, wall=(lambda: wall[0]) if wall else lambda: 0.0)


async def settle(fence: Fence, sup: Recorder, stops: int) -> None:
    task = asyncio.create_task(fence.run())
    for _ in range(100):
        await asyncio.sleep(0)
        if len(sup.stops) >= stops and fence.fenced:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_lease_run_out_stops_every_live_container_as_an_infrastructure_failure() -> None:
    async def main() -> None:
        sup = Recorder(pb.CONTAINER_RUNNING, pb.CONTAINER_EXITED, pb.CONTAINER_STARTING)
        now = [10.0]
        fence = fence_on(sup, now)
        fence.set_terms(4.0, 1.5)
        fence.renew(10.0)
        assert fence.holds()
        now[0] = 14.0
        assert not fence.holds()                 # no new container from the moment it ran out
        await settle(fence, sup, 2)
        assert sorted(c for c, _, _ in sup.stops) == ["c0", "c2"] and {g for _, g, _ in sup.stops} == {1.5}
        assert all(r.startswith("fenced: no answer from the RM for 4s") for _, _, r in sup.stops)
        assert sup.recs[0].infra_failure and sup.recs[2].infra_failure and not sup.recs[1].infra_failure
        assert fence.fenced and fence.fences == 1
        fence.renew(13.9)                        # the RM answers again (a beat sent just now)
        assert fence.holds() and not fence.fenced

    asyncio.run(main())


def test_without_a_lease_from_the_rm_nothing_is_fenced() -> None:
    async def main() -> None:
        sup = Recorder(pb.CONTAINER_RUNNING)
        now = [0.0]
        fence = fence_on(sup, now)
        fence.set_terms(0.0, 0.0)                # an RM older than the fence
        fence.renew(0.0)
        now[0] = 1e6
        await settle(fence, sup, 1)
        assert sup.stops == [] and fence.holds()

    asyncio.run(main())


def test_a_restarted_agent_keeps_the_lease_its_predecessor_held(tmp_path: Path) -> None:
    async def main() -> None:
        state = tmp_path / "lease.json"
        first = fence_on(Recorder(), [100.0], [5000.0], state)
        first.set_terms(6.0, 2.0)
        first.renew(99.0)                        # renewed 1 s ago: at wall 4999
        # The next process starts 3 s after that renewal: 3 s left, its adopted container keeps running meanwhile.
        sup = Recorder(pb.CONTAINER_RUNNING)
        now, wall = [7.0], [5002.0]
        second = fence_on(sup, now, wall, state)
        second.restore()
        assert second.holds() and second.lease.left(7.0) == 3.0
        now[0], wall[0] = 10.0, 5005.0          # the RM never answered it: the lease runs out
        await settle(second, sup, 1)
        assert [c for c, _, _ in sup.stops] == ["c0"]
        second.forget()
        assert not state.exists()

    asyncio.run(main())


def test_new_terms_from_the_rm_keep_the_running_lease_and_reach_lease_json_at_the_next_renewal(tmp_path: Path) -> None:
    # The RM lengthens the interval with the fleet and names a longer lease in a heartbeat reply (rm/state/
    # heartbeats.py); later a shorter one. A shorter lease never cuts one already running short.
    async def main() -> None:
        state = tmp_path / "lease.json"
        now, wall = [100.0], [5000.0]
        fence = fence_on(Recorder(), now, wall, state)
        fence.set_terms(6.5, 2.0)
        fence.renew(100.0)
        assert json.loads(state.read_text())["lease_s"] == 6.5
        now[0], wall[0] = 101.0, 5001.0          # under a quarter lease: no new write for the same terms ...
        fence.renew(101.0)
        assert json.loads(state.read_text())["renewed"] == 5000.0
        fence.set_terms(65.0, 2.0)               # ... but new terms are written at once
        fence.renew(101.0)
        assert json.loads(state.read_text()) == {"lease_s": 65.0, "grace_s": 2.0, "renewed": 5001.0}
        assert fence.lease.left(101.0) == 65.0
        fence.set_terms(6.5, 2.0)                # shorter: the 65 s renewed at 101 still run
        fence.renew(102.0)
        assert fence.lease.left(102.0) == 64.0 and fence.holds()

    asyncio.run(main())
