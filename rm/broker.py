"""The embedded MQTT broker (amqtt), so a one-machine cluster needs nothing else. Production points the RM at
mosquitto instead (`mqtt.url` in rm.yaml)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from amqtt.broker import Broker

log = logging.getLogger(__name__)


class EmbeddedBroker:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        for name in ("amqtt", "transitions"):
            logging.getLogger(name).setLevel(logging.WARNING)
        config: dict[str, Any] = {
            "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 10000}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._broker = Broker(config)

    async def start(self) -> None:
        await self._broker.start()
        if self.port == 0:
            server = self._broker._servers["default"].instance
            self.port = int(server.sockets[0].getsockname()[1])
        log.info("embedded MQTT broker on %s:%d", self.host, self.port)

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self._broker.shutdown(), 5)
        except Exception as exc:  # shutting down: report, never raise
            log.debug("broker shutdown: %s", exc)
