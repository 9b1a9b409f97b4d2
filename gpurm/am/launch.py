"""Starting learners: the `Launch` actions and the env each learner is started with. The gang, once every part of
the plan is held: one learner per server, torchrun's ranks and world size, the first (biggest) one the master.
A grown learner of an elastic job (am/resize.py), at once: it joins the running attempt through torchrun's elastic
rendezvous, whose env an elastic job's every learner gets.

Functions of the `Master` (its fields are the state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.attempts import live_runs, sync_learners
from gpurm.am.levels import level_label
from gpurm.am.records import Held, Launch, Phase, Run

if TYPE_CHECKING:
    from gpurm.am.master import Master


def launch_gang(m: Master) -> None:
    """The gang is complete: launch a learner on each held container (held becomes runs)."""
    assert m.plan is not None
    gang = sorted(m.held.values(), key=lambda h: (-h.gpus, h.node_id))
    world = sum(h.gpus for h in gang)
    master = gang[0]
    learners = []
    m.runs = {}
    for rank, h in enumerate(gang):
        env = {
            "MASTER_ADDR": master.host, "NNODES": str(len(gang)), "NODE_RANK": str(rank),
            "NPROC_PER_NODE": str(h.gpus), "WORLD_SIZE": str(world),
            "GPURM_ATTEMPT": str(m.attempt.number),
        }
        if m.spec.elastic:
            env.update(elastic_env(m, master, len(gang), rank == 0, h.gpus))
        learners.append((h, rank, env))
        m.runs[h.container_id] = Run(rank, h)
    m.held.clear()
    m.actions.append(Launch(m.attempt.number, learners, master.node_id))
    m.phase = Phase.LAUNCHING
    m.attempt.level = level_label(m) if m.spread else m.plan.level.label
    m.attempt.waiting_reason = "starting its learners"
    sync_learners(m)


def elastic_env(m: Master, master: Held, gang_nodes: int, is_host: bool, gpus: int) -> dict[str, str]:
    """What an elastic job's learners need for torchrun's elastic rendezvous (c10d), also as torchrun's own
    PET_* defaults, so that `torchrun --nproc-per-node=$NPROC_PER_NODE train.py` is enough. The gang's first
    learner hosts the rendezvous store (is_host): it is never taken back. The shell adds the endpoint."""
    nodes = f"{gang_nodes}:{m.spec.max_gpus}"
    host = "1" if is_host else "0"
    return {"GPURM_MIN_GPUS": str(m.spec.gpus), "GPURM_MAX_GPUS": str(m.spec.max_gpus),
            "GPURM_MIN_NODES": str(gang_nodes), "GPURM_MAX_NODES": str(m.spec.max_gpus),
            "GPURM_RDZV_IS_HOST": host, "MASTER_ADDR": master.host,
            "PET_NNODES": nodes, "PET_NPROC_PER_NODE": str(gpus), "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ID": f"{m.attempt.number}", "PET_RDZV_CONF": f"is_host={host}",
            "PET_MAX_RESTARTS": "100",
            # torchrun shares its rendezvous store with the workers by default, and then a learner joining a
            # running job never learns the workers' master address (torch 2.13): rebuild it every round.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def launch_extra(m: Master, held: Held) -> None:
    """Start a grown learner at once: it joins the others through the job's rendezvous."""
    gang = sorted((r for r in m.runs.values() if not r.extra), key=lambda r: r.rank)
    rank = max((r.rank for r in m.runs.values()), default=-1) + 1
    env = {"NNODES": str(len(live_runs(m)) + 1), "NODE_RANK": str(rank), "NPROC_PER_NODE": str(held.gpus),
           "WORLD_SIZE": str(m.live_gpus + held.gpus),
           "GPURM_ATTEMPT": str(m.attempt.number),
           **elastic_env(m, gang[0].held, len(gang), False, held.gpus)}
    m.runs[held.container_id] = Run(rank, held, extra=True)
    m.actions.append(Launch(m.attempt.number, [(held, rank, env)], gang[0].held.node_id))
    sync_learners(m)
