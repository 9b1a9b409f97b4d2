"""The embedded MQTT broker (amqtt), so a one-machine cluster needs nothing else. Production points the RM at
mosquitto instead (`mqtt.url` in rm.yaml; `gpurm admin broker-files` writes its password and ACL files).

Both enforce the same rights (brokerauth.py): no anonymous clients; `gpurm-rm` publishes; `gpurm-reader` only
subscribes, to views, jobs and telemetry. Here amqtt's plugin APIs do it: `RoleAuthPlugin` checks the password
at CONNECT, `RoleTopicPlugin` every PUBLISH, SUBSCRIBE and delivery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from amqtt.broker import Broker
from amqtt.contexts import Action as AmqttAction
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session

from gpurm.common.aio import within
from gpurm.common.mqtt import Credentials
from gpurm.rm.security.brokerauth import Action, BrokerAuth, Role, may

log = logging.getLogger(__name__)

_ACTIONS = {AmqttAction.PUBLISH: Action.PUBLISH, AmqttAction.SUBSCRIBE: Action.SUBSCRIBE,
            AmqttAction.RECEIVE: Action.SUBSCRIBE}


def _auth_of(config: Any) -> BrokerAuth:
    return BrokerAuth(Credentials(config.rm_username, config.rm_password),
                      Credentials(config.reader_username, config.reader_password))


class RoleAuthPlugin(BaseAuthPlugin):  # type: ignore[misc]  # amqtt is untyped
    """CONNECT: only the two roles' usernames with their passwords; anonymous clients are refused."""

    @dataclass
    class Config:
        rm_username: str = ""
        rm_password: str = field(default="", repr=False)
        reader_username: str = ""
        reader_password: str = field(default="", repr=False)

    async def authenticate(self, *, session: Session) -> bool | None:
        role = _auth_of(self.context.config).check_password(session.username, session.password)
        if role is None:
            log.warning("MQTT client %s refused: %s", session.client_id,
                        "wrong password" if session.username else "anonymous")
            return False
        return True


class RoleTopicPlugin(BaseTopicPlugin):  # type: ignore[misc]  # amqtt is untyped
    """PUBLISH, SUBSCRIBE and delivery: what the client's role may do (brokerauth.may)."""

    @dataclass
    class Config:
        rm_username: str = ""
        reader_username: str = ""

    async def topic_filtering(self, *, session: Session | None = None, topic: str | None = None,
                              action: AmqttAction | None = None) -> bool | None:
        if session is None or topic is None or action is None:
            return False
        config = self.context.config
        name = session.username
        role = Role.RM if name == config.rm_username else Role.READER if name == config.reader_username else None
        allowed = may(role, _ACTIONS[action], topic)
        if not allowed and action is not AmqttAction.RECEIVE:
            log.warning("MQTT client %s (%s) may not %s %s", session.client_id, name or "anonymous",
                        action.value, topic[:200])
        return allowed


class EmbeddedBroker:
    def __init__(self, host: str, port: int, auth: BrokerAuth) -> None:
        self.host = host
        self.port = port
        for name in ("amqtt", "transitions"):
            logging.getLogger(name).setLevel(logging.WARNING)
        users = {"rm_username": auth.rm.username, "reader_username": auth.reader.username}
        config: dict[str, Any] = {
            "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 10000}},
            "plugins": {
                f"{__name__}.RoleAuthPlugin": {**users, "rm_password": auth.rm.password,
                                               "reader_password": auth.reader.password},
                f"{__name__}.RoleTopicPlugin": users,
            },
        }
        self._broker = Broker(config)

    async def start(self) -> None:
        await self._broker.start()
        if self.port == 0:
            server = self._broker._servers["default"].instance
            self.port = int(server.sockets[0].getsockname()[1])
        log.info("embedded MQTT broker on %s:%d (credentials required)", self.host, self.port)

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    async def stop(self) -> None:
        try:
            await within(self._broker.shutdown(), 5)
        except Exception as exc:  # shutting down: report, never raise
            log.debug("broker shutdown: %s", exc)
