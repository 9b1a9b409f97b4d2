"""The credentials the RM hands out and checks: per-node container tokens, join proofs, AM tokens.

Pure bookkeeping around gpurm/common/tokens.py's signatures, with `now` passed in: which node key signs a container's
token, when a learner's token is due for renewal, which join proofs were already used (a replay is refused), when
an AM token is past half its life. The daemon (rm/server/daemon.py) owns one and asks it through rm/server/grants.py;
nothing here touches a socket or a clock.
"""

from __future__ import annotations

from collections.abc import Callable

from gpurm.common.model import Container, ContainerKind
from gpurm.common.tokens import JOIN_WINDOW_MS, ClusterKeys, TokenKey, am_token, am_token_expiry, sign_container
from gpurm.proto import gpurm_pb2 as pb


class Credentials:
    def __init__(self, keys: ClusterKeys) -> None:
        self.keys = keys
        self._node_keys: dict[str, TokenKey] = {}
        self._signed: dict[str, float] = {}          # container id -> expiry of the last container token signed
        self._joins: dict[tuple[str, str, int], float] = {}   # join proofs seen, with when (refused if replayed)

    def node_key(self, node_id: str) -> TokenKey:
        key = self._node_keys.get(node_id)
        if key is None:
            key = self._node_keys[node_id] = self.keys.node_key(node_id)
        return key

    def sign(self, c: Container, expiry_s: float, now: float,
             purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER, *, rightsize: bool = False) -> pb.ContainerToken:
        """A token for `c`, signed with its node's key: good on that node alone, for one purpose, `expiry_s`.
        `rightsize`: the agent limits the container's memory per detected phase (its queue's `rightsize: on`)."""
        expiry = now + expiry_s
        payload = pb.ContainerTokenPayload(
            container_id=c.container_id, job_id=c.job_id, node_id=c.node_id, gpu_indices=c.gpu_indices,
            kind=pb.CONTAINER_AM if c.kind is ContainerKind.AM else pb.CONTAINER_LEARNER, user=c.user,
            expiry_ms=round(expiry * 1000), attempt=c.attempt, purpose=purpose, rightsize=rightsize,
            gpu_share_milli=c.share_milli)
        if purpose == pb.TOKEN_CONTAINER:
            self._signed[c.container_id] = expiry
        return sign_container(payload, self.node_key(c.node_id))

    def due_for_renewal(self, container_id: str, due: float) -> bool:
        """Whether the container's last token expires before `due` (or none was signed)."""
        return self._signed.get(container_id, 0.0) < due

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the signing records of containers `keep` says are gone."""
        for cid in [cid for cid in self._signed if not keep(cid)]:
            del self._signed[cid]

    def check_join(self, request: pb.RegisterNodeRequest, now: float) -> str:
        """Why an insecure-mode registration does not prove its node ('' when it does); a proof works once."""
        why = self.keys.check_join(request.node_id, request.agent_instance, request.join_time_ms,
                                   bytes(request.join_proof), round(now * 1000))
        if why:
            return why
        seen = (request.node_id, request.agent_instance, request.join_time_ms)
        if seen in self._joins:
            return "this join proof was used before (a replayed registration)"
        cutoff = now - 2 * JOIN_WINDOW_MS / 1000      # older proofs fail the clock check anyway
        # Oldest first (insertion order): forgetting stops at the first one still young, so a stampede of
        # registrations after an RM restart costs O(1) each, not a scan of every proof seen.
        while self._joins:
            oldest, at = next(iter(self._joins.items()))
            if at >= cutoff:
                break
            del self._joins[oldest]
        self._joins[seen] = now
        return ""

    def am_token(self, job_id: str, am_attempt: int, ttl_s: float, now: float) -> str:
        return am_token(self.keys.am_key, job_id, am_attempt, round((now + ttl_s) * 1000))

    def renew_am_token(self, job_id: str, am_attempt: int, presented: str, ttl_s: float, now: float) -> str:
        """A fresh AM token once the presented one is past half its life, else ''."""
        left_s = am_token_expiry(presented) / 1000 - now
        return self.am_token(job_id, am_attempt, ttl_s, now) if left_s < ttl_s / 2 else ""
