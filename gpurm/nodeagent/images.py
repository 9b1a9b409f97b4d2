"""The images this server's engine holds, reported to the RM for image locality: the full list at registration,
then only what changed on each heartbeat (`images_added`, `images_removed`). An image job's AM prefers, at equal
locality, the servers that already hold its image (like the Kubernetes scheduler's ImageLocality), so its start
skips the pull.

The list is refreshed every `REFRESH_S` and right after an image container starts (its pull may have added one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpurm.common.aio import wait_set
from gpurm.common.jobspec import image_key
from gpurm.nodeagent.engine import Engine, run_engine
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb

log = logging.getLogger(__name__)

REFRESH_S = 30.0
MAX_IMAGES = 256          # the most a server reports (the RM keeps as many); names of at most MAX_NAME characters
MAX_NAME = 256


async def list_images(engine: Engine) -> set[str] | None:
    """The engine's tagged images, normalised (`image_key`); None when the engine does not answer."""
    res = await run_engine(engine.cmd("images", "--format", "{{.Repository}}:{{.Tag}}"))
    if res.rc != 0:
        log.warning("cannot list the engine's images: %s", res.message)
        return None
    names = {image_key(ln.strip()) for ln in res.out.splitlines()
             if ln.strip() and "<none>" not in ln and len(ln.strip()) <= MAX_NAME}
    return set(sorted(names)[:MAX_IMAGES])


class ImageReport:
    """What the RM has been told (`reported`) and what the engine holds now (`current`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.current: set[str] = set()
        self.reported: set[str] = set()
        self._kick = asyncio.Event()

    async def refresh(self) -> bool:
        """Read the engine's list; True when it differs from what was last reported."""
        names = await list_images(self.engine)
        if names is not None:
            self.current = names
        return self.current != self.reported

    def on_change(self, rec: ContainerRecord) -> None:
        """A supervisor listener: an image container that starts may have pulled its image."""
        if rec.image and rec.state == pb.CONTAINER_RUNNING:
            self._kick.set()

    async def run(self, wake: Callable[[], None], interval_s: float = REFRESH_S) -> None:
        """Refresh until cancelled; `wake` (the tracker's) sends a beat when the list changed."""
        while True:
            try:
                if await self.refresh():
                    wake()
            except Exception:   # a hint only: never the agent's end
                log.exception("listing the engine's images failed")
            self._kick.clear()
            await wait_set(self._kick, interval_s)

    def decorate(self, msg: pb.RegisterNodeRequest | pb.NodeHeartbeat) -> None:
        """The full list into a registration, the changes since into a beat."""
        if isinstance(msg, pb.RegisterNodeRequest):
            msg.images.extend(sorted(self.current))
        else:
            msg.images_added.extend(sorted(self.current - self.reported))
            msg.images_removed.extend(sorted(self.reported - self.current))
        self.reported = set(self.current)
