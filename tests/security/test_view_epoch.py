"""Findings 4 and 5 at the AM's end: the view follower trusts no version number alone.

A real RM, a real agent, a real broker and the AM's ViewFollower: after an RM restart (its version counter
starts again, lower) the follower takes the new run's views at once; a forged delta far ahead (as if someone got
past the broker's logins) freezes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from gpurm.am.view import ViewFollower
from gpurm.common import mqtt, tls
from gpurm.common.mqtt import Credentials
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.rmproc import AgentProcess, RMProcess

NODE = "epoch-node"


async def until(what: Callable[[], bool], timeout: float, describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, describe()
        await asyncio.sleep(0.05)


def set_drained(rm: RMProcess, drained: bool) -> None:
    rm.admin.DrainNode(pb.DrainNodeRequest(node_id=NODE, undrain=not drained), metadata=rm.metadata, timeout=10)


def node_state(follower: ViewFollower) -> int:
    return next((n.state for n in follower.current.nodes if n.node_id == NODE), -1)


async def test_the_am_follows_views_across_an_rm_restart_and_ignores_a_forged_jump(tmp_path: Path,
                                                                                   broker: TestBroker) -> None:
    rm = RMProcess(tmp_path / "rm", broker, heartbeat="500ms")
    agent = AgentProcess(tmp_path / "agent", rm, NODE)
    try:
        agent.start()
        info = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), metadata=rm.metadata, timeout=10)
        first_epoch = info.epoch
        assert first_epoch >= 1
        async with tls.aio_channel(rm.address, None) as channel:
            client = pbg.ClientStub(channel)
            initial = await client.GetClusterView(pb.GetClusterViewRequest(), timeout=10)
            assert initial.epoch == first_epoch
            follower = ViewFollower(info.mqtt_url, client, initial,
                                    credentials=Credentials(info.mqtt_username, info.mqtt_password))
            await follower.start()
            try:
                # Run the version up in the first run, so the restarted RM counts from below it.
                for i in range(30):
                    set_drained(rm, i % 2 == 0)
                set_drained(rm, False)
                await until(lambda: node_state(follower) == pb.NODE_RUNNING and follower.current.version >= 30, 15,
                            lambda: f"the follower did not catch up: {follower.summary()}")
                high = follower.current.version

                rm.stop()
                rm.start()
                again = rm.client.GetClusterInfo(pb.ClusterInfoRequest(), metadata=rm.metadata, timeout=10)
                assert again.epoch == first_epoch + 1
                rm.wait_node(NODE)
                set_drained(rm, True)
                restarted = rm.client.GetClusterView(pb.GetClusterViewRequest(), timeout=10)
                assert restarted.version < high, "the restarted RM's versions count again from below"
                await until(lambda: node_state(follower) in (pb.NODE_DRAINING, pb.NODE_DECOMMISSIONED), 15,
                            lambda: f"the follower ignores the restarted RM's views: {follower.summary()}")
                assert follower.current.epoch == first_epoch + 1

                # A forged delta far ahead, published past the broker's logins (the RM's own): ignored.
                forged = pb.ClusterView(version=2**62, base_version=0, delta=True, epoch=again.epoch, nodes=[
                    pb.NodeView(node_id=NODE, state=pb.NODE_RUNNING, free_gpus=list(range(64)))])
                async with mqtt.client(info.mqtt_url, broker.auth.rm) as forger:
                    await forger.publish(mqtt.TOPIC_VIEW_DELTA, forged.SerializeToString())
                await until(lambda: follower.resyncs >= 1, 10, lambda: f"no resync: {follower.summary()}")
                assert follower.current.version < 2**62
                set_drained(rm, False)
                await until(lambda: node_state(follower) == pb.NODE_RUNNING, 15,
                            lambda: f"the forged delta froze the follower: {follower.summary()}")
            finally:
                await follower.stop()
    except grpc.RpcError as exc:
        raise AssertionError(f"{exc.code().name}: {exc.details()}\n{rm.log_text()[-3000:]}") from None
    finally:
        agent.close()
        rm.close()
