"""Free TCP ports handed to jobs (e.g. the torchrun rendezvous port of rank 0), never the same one twice
within a quarantine window, so two jobs asking at once cannot both get the port neither has bound yet."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

QUARANTINE_S = 60.0
_TRIES = 50


class PortReserver:
    def __init__(self, host: str, *, quarantine_s: float = QUARANTINE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.quarantine_s = quarantine_s
        self._clock = clock
        self._handed: dict[int, float] = {}  # port → when its quarantine ends

    def reserve(self) -> int:
        """A port that was free on `host` a moment ago and was not handed out in the last quarantine_s."""
        now = self._clock()
        self._handed = {p: until for p, until in self._handed.items() if until > now}
        for _ in range(_TRIES):
            port = self._probe()
            if port not in self._handed:
                self._handed[port] = now + self.quarantine_s
                return port
        raise OSError(f"no free port on {self.host} outside the {self.quarantine_s:.0f}s quarantine")

    def _probe(self) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((self.host, 0))
                return int(s.getsockname()[1])
        except OSError:
            # `host` may be a name or NAT address that is not one of ours: any local interface then.
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                return int(s.getsockname()[1])
