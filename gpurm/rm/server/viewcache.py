"""The cluster view, serialised once per change and shared.

Each node's entry in the view (a `ClusterView.nodes` element, already encoded as that field) is encoded again only
when the node changed; the full view is a small header followed by the entries in node order. Protobuf lets a
message be built by concatenating encoded fields, so the bytes are exactly what serialising the whole ClusterView
would give, at the cost of a join rather than of building and encoding 10,000 NodeView messages per request. Every
reader of the full view (an AM registering, `GetClusterView`, the retained MQTT snapshot) shares one body per
view version; MQTT deltas carry the nodes changed since the last delta.
"""

from __future__ import annotations

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.server import convert
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.planview import reserved_server


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """`payload` encoded as protobuf field `field_number` of wire type 2 (a message, bytes or string)."""
    return _varint((field_number << 3) | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class ViewCache:
    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}         # node id -> its encoded `nodes` entry
        self._order: list[str] | None = None          # the node ids sorted (None: nodes came or went)
        self._body: tuple[int, bytes] | None = None  # (view version, the entries joined)
        self._delta: dict[str, None] = {}             # nodes changed since the last delta was taken
        self._core: RMCore | None = None

    def refresh(self, core: RMCore) -> None:
        """Re-encode the nodes that changed since the last refresh (all of them for a new core: a rollback)."""
        if core is not self._core:
            self._core = core
            self._entries.clear()
            self._order = None
            self._body = None
            changed = set(core.cluster.nodes) | core.cluster.take_changed()
        else:
            changed = core.cluster.take_changed()
        for node_id in changed:
            self._delta[node_id] = None
            node = core.cluster.nodes.get(node_id)
            if node is None:
                if self._entries.pop(node_id, None) is not None:
                    self._order = None
                continue
            view = convert.node_view_to_pb(node, core.elastic.reclaimable(node_id),
                                           reserved_server(node, core.elastic, core.reservations))
            if node_id not in self._entries:
                self._order = None
            self._entries[node_id] = length_delimited(3, view.SerializeToString())
        if changed:
            self._body = None

    def full(self, core: RMCore, epoch: int, now: float) -> bytes:
        """The whole ClusterView, encoded."""
        self.refresh(core)
        version = core.cluster.version
        if self._body is None or self._body[0] != version:
            if self._order is None:
                self._order = sorted(self._entries)
            self._body = (version, b"".join(self._entries[n] for n in self._order))
        header = pb.ClusterView(version=version, time_ms=convert.ms(now), epoch=epoch).SerializeToString()
        return header + self._body[1]

    def entries(self, node_ids: list[str]) -> bytes:
        """The encoded entries of these nodes (appended to a ClusterView header: a delta)."""
        return b"".join(self._entries[n] for n in node_ids if n in self._entries)

    def take_delta(self, core: RMCore) -> list[str]:
        """The nodes changed since the last call, in node order (each goes whole into the next delta)."""
        self.refresh(core)
        out = sorted(self._delta)
        self._delta = {}
        return out
