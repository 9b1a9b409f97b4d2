"""The AM's copy of the cluster view: the RM's retained snapshot over MQTT, kept current by versioned deltas;
a snapshot over gRPC whenever MQTT is unavailable. The view is advice; the RM's grants are the truth."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiomqtt
import grpc

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm import mqtt
from gpurm.rm.brokerauth import Credentials

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0


class ViewFollower:
    def __init__(self, mqtt_url: str, client: pbg.ClientStub, initial: pb.ClusterView,
                 credentials: Credentials | None = None) -> None:
        """`credentials`: the read-only broker login from the RM's RegisterAMResponse."""
        self.mqtt_url = mqtt_url
        self.credentials = credentials
        self.client = client
        self.current = initial
        self.changed = False
        self.mqtt_live = False
        self.gaps = 0
        self.deltas = 0          # deltas applied
        self.polls = 0           # snapshots fetched over gRPC
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def summary(self) -> str:
        return (f"version {self.current.version}, {self.deltas} deltas over MQTT, {self.gaps} gaps, "
                f"{self.polls} snapshots over gRPC")

    def take(self) -> pb.ClusterView:
        self.changed = False
        return self.current

    def apply_snapshot(self, view: pb.ClusterView) -> None:
        if view.version >= self.current.version:
            self.current = view
            self.changed = True

    def apply_delta(self, delta: pb.ClusterView) -> bool:
        """Apply a delta; False when this view is too old for it (it missed changes: fetch a snapshot)."""
        if delta.version <= self.current.version:
            return True
        if delta.base_version > self.current.version:
            return False
        nodes: dict[str, pb.NodeView] = {n.node_id: n for n in self.current.nodes}
        for n in delta.nodes:
            nodes[n.node_id] = n
        merged = [nodes[k] for k in sorted(nodes)]
        self.current = pb.ClusterView(version=delta.version, time_ms=delta.time_ms, nodes=merged)
        self.changed = True
        self.deltas += 1
        return True

    async def _run(self) -> None:
        while True:
            if self.mqtt_url:
                try:
                    await self._follow_mqtt()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.info("cluster view over MQTT unavailable (%s); polling the RM", exc)
                self.mqtt_live = False
            await self._poll_once()
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _follow_mqtt(self) -> None:
        async with mqtt.client(self.mqtt_url, self.credentials) as c:
            await c.subscribe(mqtt.TOPIC_VIEW, qos=1)
            await c.subscribe(mqtt.TOPIC_VIEW_DELTA, qos=0)
            self.mqtt_live = True
            async for message in c.messages:
                view = pb.ClusterView()
                try:
                    view.ParseFromString(bytes(message.payload))
                except Exception:
                    continue
                if message.topic.matches(mqtt.TOPIC_VIEW):
                    self.apply_snapshot(view)
                elif not self.apply_delta(view):
                    self.gaps += 1
                    await self._poll_once()      # missed a delta: catch up from the RM at once

    async def _poll_once(self) -> None:
        try:
            self.apply_snapshot(await self.client.GetClusterView(pb.GetClusterViewRequest(), timeout=5))
            self.polls += 1
        except grpc.aio.AioRpcError as exc:
            log.debug("view poll failed: %s", exc.code().name)


__all__ = ["ViewFollower", "aiomqtt"]
