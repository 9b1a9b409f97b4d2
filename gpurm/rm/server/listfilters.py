"""Filters the RM applies to its list pages (ListNodes; ListJobs' name), so that a caller fetches only what it
shows: `gpurm nodes --rack r7 --free 8`, `gpurm jobs --all --name 'sweep-*'`. Pure: a filter is built from a request
(bad input: RequestError naming the field) and tests one record."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.state.cluster import Node, NodeState
from gpurm.rm.state.messages import ErrorCode, RequestError

MAX_PATTERN = 256
NODE_STATE_FROM_PB = {pb.NODE_RUNNING: NodeState.RUNNING, pb.NODE_UNHEALTHY: NodeState.UNHEALTHY,
                      pb.NODE_LOST: NodeState.LOST, pb.NODE_DRAINING: NodeState.DRAINING,
                      pb.NODE_DECOMMISSIONED: NodeState.DECOMMISSIONED}


def glob(field: str, pattern: str) -> Callable[[str], bool] | None:
    """A shell-style pattern (* ? [abc], case-sensitive) as a test of a whole text; None for "" (anything)."""
    if not pattern:
        return None
    if len(pattern) > MAX_PATTERN:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, f"{field}: at most {MAX_PATTERN} characters, got "
                                                       f"{len(pattern)}")
    if not any(c in pattern for c in "*?["):
        return pattern.__eq__
    return re.compile(fnmatch.translate(pattern)).match     # type: ignore[return-value]


@dataclass(frozen=True)
class NodeFilter:
    states: frozenset[NodeState] = frozenset()
    rack: str = ""
    model: Callable[[str], bool] | None = None
    min_free: int = 0
    name: Callable[[str], bool] | None = None

    @property
    def any(self) -> bool:
        """Whether it filters at all."""
        return bool(self.states or self.rack or self.model or self.min_free or self.name)

    def __call__(self, node: Node) -> bool:
        if self.states and node.state not in self.states:
            return False
        if self.rack and self.rack not in (node.rack, node.ib_domain):
            return False
        if self.min_free and node.free < self.min_free:
            return False
        if self.name is not None and not self.name(node.node_id):
            return False
        model = self.model
        return model is None or any(model(g.model) for g in node.gpus.values())


def node_filter(request: pb.ListNodesRequest) -> NodeFilter:
    unknown = [s for s in request.states if s not in NODE_STATE_FROM_PB]
    if unknown:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, f"states: unknown node state {unknown[0]}")
    if request.min_free_gpus < 0:
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"min_free_gpus: must be 0 (any) or more, got {request.min_free_gpus}")
    if len(request.rack) > MAX_PATTERN:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, f"rack: at most {MAX_PATTERN} characters")
    return NodeFilter(states=frozenset(NODE_STATE_FROM_PB[s] for s in request.states), rack=request.rack,
                      model=glob("gpu_model", request.gpu_model), min_free=request.min_free_gpus,
                      name=glob("name", request.name))
