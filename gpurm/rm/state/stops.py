"""Stop orders for agents: what each node is to stop, handed to its heartbeat stream, and when each was last sent
(an order the agent has not acted on is repeated). Pure bookkeeping: the core decides what to stop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopOrder:
    node_id: str
    container_id: str
    grace_s: float
    reason: str


class StopBook:
    def __init__(self) -> None:
        self.pending: dict[str, dict[str, StopOrder]] = {}   # node id -> container id -> order not yet sent
        self.sent: dict[str, float] = {}                     # container id -> when its stop was last sent

    def order(self, o: StopOrder) -> None:
        """Queue an order (replacing one not yet sent for the same container)."""
        self.pending.setdefault(o.node_id, {})[o.container_id] = o

    def take(self, node_id: str, now: float) -> list[StopOrder]:
        """The node's orders, to send now."""
        orders = list(self.pending.pop(node_id, {}).values())
        for o in orders:
            self.sent[o.container_id] = now
        return orders

    def nodes(self) -> list[str]:
        """Nodes with orders waiting."""
        return [n for n, orders in self.pending.items() if orders]

    def drop_node(self, node_id: str) -> None:
        """The node re-registered or was lost: its waiting orders are void."""
        self.pending.pop(node_id, None)

    def ended(self, container_id: str) -> None:
        """The container ended: nothing to repeat."""
        self.sent.pop(container_id, None)

    def resend_due(self, node_id: str, container_id: str, now: float, resend_s: float) -> bool:
        """Whether a stop the agent has not acted on should go again (none waits, the last went long enough ago)."""
        return now - self.sent.get(container_id, 0.0) > resend_s and container_id not in self.pending.get(node_id, {})
