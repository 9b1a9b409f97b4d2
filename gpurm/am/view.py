"""The AM's copy of the cluster view: the RM's retained snapshot over MQTT, kept current by versioned deltas;
a snapshot over gRPC whenever MQTT is unavailable. The view is advice; the RM's grants are the truth.

A version number alone is not trusted: views carry the RM's epoch (+1 on every RM start), and anything over MQTT
from another epoch, based on a version this view does not have (a gap), or far ahead of it (a jump) makes the
AM fetch the view over gRPC instead, which always replaces what it has."""

from __future__ import annotations

import asyncio
import logging

import aiomqtt
import grpc

from gpurm.common import mqtt
from gpurm.common.aio import stop_task
from gpurm.common.mqtt import Credentials
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0
MAX_JUMP = 1_000_000        # versions a delta may move ahead at once; beyond it the AM resyncs over gRPC
RESYNC_MIN_INTERVAL_S = 1.0  # at most one gRPC resync per second, however many odd messages arrive


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
        self.resyncs = 0         # gRPC fetches because an MQTT message was from another epoch, a gap or a jump
        self._last_resync = 0.0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await stop_task(self._task)      # cancelled while connecting, it may carry on: see gpurm/common/aio.py

    def summary(self) -> str:
        return (f"epoch {self.current.epoch} version {self.current.version}, {self.deltas} deltas over MQTT, "
                f"{self.gaps} gaps, {self.resyncs} resyncs, {self.polls} snapshots over gRPC")

    def take(self) -> pb.ClusterView:
        self.changed = False
        return self.current

    def replace(self, view: pb.ClusterView) -> None:
        """A view from the RM over gRPC: the authority, whatever its epoch and version."""
        self.current = view
        self.changed = True

    def apply_snapshot(self, view: pb.ClusterView) -> bool:
        """A retained snapshot over MQTT; False when it cannot be trusted as is (resync over gRPC)."""
        if not self._same_run(view):
            return False
        if view.version >= self.current.version:
            self.current = view
            self.changed = True
        return True

    def apply_delta(self, delta: pb.ClusterView) -> bool:
        """Apply a delta; False when this view cannot take it (another epoch, missed changes, an implausible
        jump): then fetch a snapshot over gRPC."""
        if not self._same_run(delta):
            return False
        if delta.version <= self.current.version:
            return True
        if delta.base_version > self.current.version:
            return False
        nodes: dict[str, pb.NodeView] = {n.node_id: n for n in self.current.nodes}
        for n in delta.nodes:
            nodes[n.node_id] = n
        merged = [nodes[k] for k in sorted(nodes)]
        self.current = pb.ClusterView(version=delta.version, time_ms=delta.time_ms, nodes=merged, epoch=delta.epoch)
        self.changed = True
        self.deltas += 1
        return True

    def _same_run(self, view: pb.ClusterView) -> bool:
        """Whether `view` comes from the RM run this view follows, at a plausible version."""
        return view.epoch == self.current.epoch and view.version - self.current.version <= MAX_JUMP

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
                ok = (self.apply_snapshot(view) if message.topic.matches(mqtt.TOPIC_VIEW)
                      else self.apply_delta(view))
                if not ok:
                    self.gaps += 1
                    await self._resync()

    async def _resync(self) -> None:
        """Catch up from the RM over gRPC at once, at most once per RESYNC_MIN_INTERVAL_S."""
        now = asyncio.get_running_loop().time()
        if now - self._last_resync < RESYNC_MIN_INTERVAL_S:
            return
        self._last_resync = now
        self.resyncs += 1
        await self._poll_once()

    async def _poll_once(self) -> None:
        try:
            self.replace(await self.client.GetClusterView(pb.GetClusterViewRequest(), timeout=5))
            self.polls += 1
        except grpc.aio.AioRpcError as exc:
            log.debug("view poll failed: %s", exc.code().name)


__all__ = ["ViewFollower", "aiomqtt"]
