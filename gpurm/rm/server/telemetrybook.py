"""The RM's memory of GPU telemetry: each node's latest reading (its heartbeat's JSON) and a short history of
per-GPU utilisation, for the web UI's charts (gpurm/rm/http/). Pure: the daemon feeds it what the agents send;
nothing is stored on disk, so a restarted RM starts with no history."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HISTORY = 180              # samples kept per node (15 minutes at the agents' default 5 s interval)


@dataclass
class NodeTelemetry:
    latest: dict[str, Any] = field(default_factory=dict)
    # (time_ms, {gpu index: utilisation %}) oldest first
    history: deque[tuple[int, dict[int, float]]] = field(default_factory=lambda: deque(maxlen=HISTORY))


class TelemetryBook:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeTelemetry] = {}

    def record(self, node_id: str, payload: bytes) -> None:
        """Keep a reading that `publisher.telemetry_problem` accepted (a JSON object of at most 64 KiB)."""
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        entry = self.nodes.setdefault(node_id, NodeTelemetry())
        entry.latest = data
        utils: dict[int, float] = {}
        for row in data.get("gpus") or []:
            if isinstance(row, dict) and isinstance(row.get("index"), int) \
                    and isinstance(row.get("util_pct"), int | float):
                utils[row["index"]] = float(row["util_pct"])
        time_ms = data.get("time_ms")
        if isinstance(time_ms, int):
            entry.history.append((time_ms, utils))

    def latest(self, node_id: str) -> dict[str, Any]:
        entry = self.nodes.get(node_id)
        return entry.latest if entry is not None else {}

    def series(self, node_id: str, gpus: set[int] | None = None) -> list[dict[str, Any]]:
        """[{time_ms, gpus: {index: util %}}] oldest first; only `gpus` when given."""
        entry = self.nodes.get(node_id)
        if entry is None:
            return []
        return [{"time_ms": t, "util_pct": {str(i): u for i, u in sorted(utils.items()) if gpus is None or i in gpus}}
                for t, utils in entry.history]
