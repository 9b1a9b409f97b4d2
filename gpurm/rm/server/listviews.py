"""Serialized list views (ListJobs, ListNodes) that the RM reuses between pages: a listing of 100,000 finished
jobs or 10,000 servers otherwise rebuilds the same protobuf messages on every `gpurm jobs --all` / `gpurm nodes`.

- A finished job whose containers have all ended never changes: its ListJobs view is kept as bytes (per job, and
  per whether the asker may see its env values when it has any), at most `max_jobs` of them, the oldest dropped;
  once listed as JSON (`gpurm jobs -o json`: ListJobsRequest.json), its JSON text too, at most `max_json`.
- A server's GPUs (with their NVLink / PCIe links, most of a NodeInfo) change only on a health change or a new
  registration: kept as bytes per node (with links, and without them for a `brief` listing), checked against the
  GPU records' identity and health on every use. The rest of a NodeInfo (state, free GPUs, heartbeat,
  assignments) is built afresh for each page.

A reply is assembled from the pieces (protobuf's wire format: a message's serialized fields may be concatenated,
and a repeated field is its entries one after another) and parsed once, in C.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpurm.common.jsonshape import ITEM_SEPARATOR, to_json_text
from gpurm.common.model import Job
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.server import convert, pbviews
from gpurm.rm.state.cluster import Node
from gpurm.rm.state.core import RMCore

MAX_JOBS = 200_000          # finished jobs' views kept (a few hundred bytes each)
MAX_JSON = 100_000          # finished jobs' JSON text kept, once listed as JSON (~0.8 KB each)
_SEPARATOR = ITEM_SEPARATOR.encode()
_FIELD_ONE = b"\x0a"        # field 1, length-delimited: `jobs` of ListJobsResponse, `nodes` of ListNodesResponse


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _entries(parts: Sequence[bytes]) -> bytes:
    """Serialized messages as the entries of a reply's field 1."""
    return b"".join(_FIELD_ONE + _varint(len(p)) + p for p in parts)


class ListViews:
    def __init__(self, max_jobs: int = MAX_JOBS, max_json: int = MAX_JSON) -> None:
        self.max_jobs = max_jobs
        self.jobs: dict[tuple[str, bool], bytes] = {}
        self.jobs_json: dict[tuple[str, bool], bytes] = {}     # finished jobs' JSON text (job_json)
        self.max_json = max_json
        self.gpus: dict[tuple[str, bool], tuple[tuple[Any, ...], bytes]] = {}

    # ------------------------------------------------------------ jobs

    def job_list(self, core: RMCore, records: Sequence[Job], usage: Mapping[str, str],
                 may_see: Callable[[Job], bool], forecasts: pbviews.Forecasts | None = None) -> pb.ListJobsResponse:
        """A ListJobs reply holding these jobs as pbviews.job_list shows them (next_page_token, total unset)."""
        keys = [(r.job_id, bool(r.spec.env) and may_see(r)) for r in records]
        parts: list[bytes | None] = [self.jobs.get(k) for k in keys]
        missing = [i for i, p in enumerate(parts) if p is None]
        if missing:
            built = pbviews.job_list(core, [records[i] for i in missing], usage, may_see, forecasts)
            for i, msg in zip(missing, built, strict=True):
                data = msg.SerializeToString()
                parts[i] = data
                record = records[i]
                if record.state.terminal and not core.live_count(record.job_id):
                    self._keep_job(keys[i], data)
        return pb.ListJobsResponse.FromString(_entries([p for p in parts if p is not None]))

    def job_json(self, core: RMCore, records: Sequence[Job], usage: Mapping[str, str],
                 may_see: Callable[[Job], bool], forecasts: pbviews.Forecasts | None = None) -> bytes:
        """These jobs as `gpurm jobs -o json` prints them: each job_list view as one line of JSON text
        (jsonshape.to_json_text, ASCII), joined by an array's separator. Written here, the command only writes
        the page out (a 100,000-job listing spent most of the command's CPU writing JSON); a finished job's text is
        kept as its view is."""
        keys = [(r.job_id, bool(r.spec.env) and may_see(r)) for r in records]
        texts: list[bytes | None] = [self.jobs_json.get(k) for k in keys]
        missing = [i for i, t in enumerate(texts) if t is None]
        if missing:
            reply = self.job_list(core, [records[i] for i in missing], usage, may_see, forecasts)
            for i, msg in zip(missing, reply.jobs, strict=True):
                text = texts[i] = to_json_text(msg).encode("ascii")
                record = records[i]
                if record.state.terminal and not core.live_count(record.job_id):
                    self.jobs_json[keys[i]] = text
                    while len(self.jobs_json) > self.max_json:
                        del self.jobs_json[next(iter(self.jobs_json))]
        return _SEPARATOR.join([t for t in texts if t is not None])

    def _keep_job(self, key: tuple[str, bool], data: bytes) -> None:
        self.jobs[key] = data
        while len(self.jobs) > self.max_jobs:
            del self.jobs[next(iter(self.jobs))]

    # ------------------------------------------------------------ nodes

    def node_list(self, nodes: Sequence[Node], brief: bool = False) -> pb.ListNodesResponse:
        """A ListNodes reply holding these nodes as convert.node_to_pb shows them (total, token unset); `brief`:
        their GPUs without links."""
        return pb.ListNodesResponse.FromString(_entries([self.node(n, brief) for n in nodes]))

    def node(self, node: Node, brief: bool = False) -> bytes:
        return self._gpus(node, brief) + convert.node_to_pb(node, with_gpus=False).SerializeToString()

    def _gpus(self, node: Node, brief: bool) -> bytes:
        check = (id(node.gpus), *((id(g), g.healthy, g.health_reason) for g in node.gpus.values()))
        kept = self.gpus.get((node.node_id, brief))
        if kept is not None and kept[0] == check:
            return kept[1]
        gpus = [convert.gpu_to_pb(g) for _, g in sorted(node.gpus.items())]
        if brief:
            for gpu in gpus:
                del gpu.links[:]
        data = pb.NodeInfo(gpus=gpus).SerializeToString()
        self.gpus[(node.node_id, brief)] = (check, data)
        return data
