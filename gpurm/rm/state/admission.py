"""Who may do what with a job, decided from the queue tree alone: which leaf a submission goes to, whether its
user may submit there and its size could ever run there (cluster size, queue `max_gpus`, `max_gpus_per_user`),
and who may kill a job. Each refusal is a `RequestError` naming the field and the way out.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job
from gpurm.queues.tree import QueueTree, acl_allows
from gpurm.rm.state.messages import ErrorCode, RequestError

DEFAULT_QUEUE = "default"


def resolve_queue(tree: QueueTree, name: str) -> str:
    """The leaf queue a job naming `name` (or nothing: `default`) goes to."""
    if not name:
        q = tree.find(DEFAULT_QUEUE)
        if q is None or not q.leaf:
            raise RequestError(ErrorCode.INVALID_ARGUMENT,
                               "queue: the job names no queue and there is no `default` leaf queue; name one "
                               "with --queue (see `gpurm queues`)")
        return q.path
    q = tree.find(name)
    leaves = ", ".join(leaf.short for leaf in tree.leaves)
    if q is None:
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"queue: no queue {name!r}; jobs go to a leaf queue: {leaves}")
    if not q.leaf:
        below = ", ".join(leaf.short for leaf in tree.leaves if leaf.path.startswith(q.path + "."))
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"queue: {q.short} is a parent queue; jobs go to one of its leaves: {below}")
    return q.path


def admit(tree: QueueTree, spec: JobSpec, user: str, groups: Iterable[str], total_gpus: int,
          check_acl: bool = True) -> str:
    """The leaf queue of an acceptable submission; a RequestError otherwise."""
    queue = resolve_queue(tree, spec.queue)
    leaf = tree.by_path[queue]
    if check_acl and not acl_allows(leaf.effective_submit, user, groups):
        admins = ", ".join(sorted(leaf.effective_admin)) or "an RM admin"
        raise RequestError(ErrorCode.PERMISSION_DENIED,
                           f"queue: {user} may not submit to {leaf.short} (submit ACL: "
                           f"{', '.join(sorted(leaf.effective_submit))}); ask {admins} for access")
    total = total_gpus
    if spec.gpus > total:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"gpus: the job asks for {spec.gpus} GPUs but the whole cluster has {total}; "
            "ask for fewer (see `gpurm nodes`)" if total else
            f"gpus: the job asks for {spec.gpus} GPUs but no node has registered yet; start agents first",
        )
    limit = leaf.max_gpus_per_user if leaf.max_gpus_per_user is not None else leaf.max_gpus
    for q in leaf.ancestry():
        if q.max_gpus is not None and spec.gpus > q.max_gpus:
            raise RequestError(ErrorCode.INVALID_ARGUMENT,
                               f"gpus: {spec.gpus} is above queue {q.short}'s max_gpus ({q.max_gpus}); "
                               "it could never run there")
    if limit is not None and spec.gpus > limit:
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"gpus: {spec.gpus} is above max_gpus_per_user ({limit}) of {leaf.short}")
    return queue


def may_kill(tree: QueueTree, job: Job, user: str, groups: Iterable[str] = (), rm_admin: bool = False) -> bool:
    """The job's owner, its queue's admins and the RM's admins may kill it."""
    if rm_admin or user == job.user:
        return True
    leaf = tree.by_path.get(job.queue)
    return leaf is not None and acl_allows(leaf.effective_admin, user, groups)
