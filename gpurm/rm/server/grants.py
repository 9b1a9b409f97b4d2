"""What the RM hands out to let a process act: container tokens signed for one node (carrying the learner's queue's
`rightsize` flag), container grants as an AM receives them, AM tokens fresh and renewed, grants re-signed once past
a third of their life, node join proofs checked, and the tokens of containers no longer live forgotten.

The bookkeeping and the cryptography are rm/security/credentials.py and gpurm/common/tokens.py (pure, `now` passed
in); `Grants` reads the clock and the core for them. RMShell (rm/server/daemon.py) owns one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpurm.common.model import Container, ContainerKind
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.security.credentials import Credentials
from gpurm.rm.state.core import RMCore


class Grants:
    def __init__(self, creds: Credentials, core: Callable[[], RMCore]) -> None:
        """`core`: the shell's core now (a failed write replaces it)."""
        self.creds = creds
        self._core = core

    def sign(self, c: Container, expiry_s: float, purpose: pb.TokenPurpose = pb.TOKEN_CONTAINER) -> pb.ContainerToken:
        return self.creds.sign(c, expiry_s, time.time(), purpose, rightsize=self.rightsize_on(c))

    def rightsize_on(self, c: Container) -> bool:
        """Whether a learner's queue (as configured now) has `rightsize: on`."""
        if c.kind is not ContainerKind.LEARNER:
            return False
        core = self._core()
        job = core.jobs.get(c.job_id)
        q = core.queues.tree.by_path.get(job.queue) if job is not None else None
        return q is not None and q.effective_rightsize

    def grant_pb(self, container_id: str) -> pb.ContainerGrant:
        core = self._core()
        c = core.containers[container_id]
        node = core.cluster.nodes[c.node_id]
        return pb.ContainerGrant(container_id=c.container_id, node_id=c.node_id, host=node.host,
                                 agent_port=node.port, gpu_indices=c.gpu_indices,
                                 token=self.sign(c, core.settings.token_ttl_s), preemptible=c.preemptible,
                                 rack=node.rack, attempt=c.attempt, gpu_share_milli=c.share_milli)

    def check_join(self, request: pb.RegisterNodeRequest) -> str:
        return self.creds.check_join(request, time.time())

    def fresh_am_token(self, job_id: str, am_attempt: int, ttl_s: float | None = None) -> str:
        ttl = ttl_s if ttl_s is not None else self._core().settings.token_ttl_s
        return self.creds.am_token(job_id, am_attempt, ttl, time.time())

    def renew_am_token(self, job_id: str, am_attempt: int, presented: str) -> str:
        return self.creds.renew_am_token(job_id, am_attempt, presented, self._core().settings.token_ttl_s,
                                         time.time())

    def renew_grants(self, job_id: str, skip: set[str]) -> list[pb.ContainerGrant]:
        """Grants of this job's live learners whose tokens are past a third of their life, re-signed."""
        core = self._core()
        ttl = core.settings.token_ttl_s
        due = time.time() + ttl * 2 / 3
        out = []
        for c in core.job_containers(job_id):
            if c.kind is ContainerKind.AM or c.container_id in skip or not c.phase.live:
                continue
            if self.creds.due_for_renewal(c.container_id, due) and c.node_id in core.cluster.nodes:
                out.append(self.grant_pb(c.container_id))
        return out

    def forget_ended(self) -> None:
        """Forget the renewal bookkeeping of containers no longer live."""
        core = self._core()
        self.creds.forget(lambda cid: (c := core.containers.get(cid)) is not None and c.phase.live)
