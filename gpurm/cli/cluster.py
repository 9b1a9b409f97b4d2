"""Cluster commands: nodes, queues and the admin group."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpurm.cli.basics import PAGE_SIZE, CliError
from gpurm.cli.client import connect, page_size_arg
from gpurm.cli.output import JsonArray, StreamTable, ago, message_dict, print_json, table
from gpurm.common.fields import format_duration
from gpurm.common.jobspec import share_text
from gpurm.proto import gpurm_pb2 as pb

NODE_STATES = {v: k.removeprefix("NODE_") for k, v in pb.NodeState.items()}


NODE_HEADERS = ["NODE", "RACK", "STATE", "FREE/GPUS", "MODEL", "CONTAINERS", "IMAGES", "AGENT", "BEAT", "NOTE"]


def cmd_nodes(args: argparse.Namespace) -> int:
    """Every node (or the first --limit), by node id, fetched and printed a page at a time."""
    rm = connect(args)
    limit = getattr(args, "limit", 0) or 0
    if limit < 0:
        raise CliError(f"--limit: must be 0 (every node) or more, got {limit}")
    size = page_size_arg(args, PAGE_SIZE)
    request = pb.ListNodesRequest(page_size=min(limit, size) if limit else size, brief=args.output != "json",
                                  **node_filters(args))
    pages = rm.pages(rm.client.ListNodes, request, limit)
    if args.output == "json":
        with JsonArray() as out:
            for reply in pages:
                out.extend(reply.nodes[:limit - out.count if limit else None])
        return 0
    now = time.time()
    shown = free = total = known = 0
    rows = StreamTable(NODE_HEADERS, max_last=60)
    for reply in pages:
        known = reply.total
        nodes = list(reply.nodes[:limit - shown if limit else None])
        rows.add([node_row(n, now) for n in nodes])
        shown += len(nodes)
        free += sum(n.gpus_free for n in nodes)
        total += sum(n.gpus_total for n in nodes)
    filtered = bool(node_filters(args))
    if not shown:
        print(f"no nodes match (of {known} the RM knows)" if filtered else
              "no nodes have registered: start agents (`gpurm agent --config configs/agent.yaml`)")
        return 0
    more = (f" (of {known})" if filtered else
            f" (the first {shown} of {known}: --limit)" if known > shown else "")
    print(f"{shown} nodes{more}, {free} of {total} GPUs free")
    return 0


def node_filters(args: argparse.Namespace) -> dict[str, Any]:
    """The ListNodesRequest filters the flags ask for (the RM applies them)."""
    out: dict[str, Any] = {}
    if getattr(args, "state", None):
        out["states"] = [pb.NodeState.Value(f"NODE_{s}") for s in args.state]
    if getattr(args, "free", 0):
        if args.free < 0:
            raise CliError(f"--free: must be 0 (any) or more, got {args.free}")
        out["min_free_gpus"] = args.free
    for flag, field in (("rack", "rack"), ("model", "gpu_model"), ("name", "name")):
        if getattr(args, flag, None):
            out[field] = getattr(args, flag)
    return out


def node_row(n: pb.NodeInfo, now: float) -> list[object]:
    models = sorted({g.model for g in n.gpus}) or ["-"]
    unhealthy = [g.index for g in n.gpus if not g.healthy]
    note = n.health_report or (f"unhealthy GPUs {unhealthy}" if unhealthy else "")
    shared = shared_gpus(n)
    if shared:
        note = "; ".join(x for x in (note, f"shared {shared}") if x)
    return [n.node_id, n.rack, NODE_STATES.get(n.state, "?"), f"{n.gpus_free}/{n.gpus_total}", ",".join(models),
            n.containers, images_column(n), f"{n.host}:{n.agent_port}", ago(n.last_heartbeat_ms, now), note]


def images_column(n: pb.NodeInfo) -> str:
    """Whether a server runs image jobs, with which engine and how it passes GPUs: `podman/cdi`, or `-`."""
    if not n.container_engine:
        return "-"
    return f"{n.container_engine}/{n.gpu_passing}" if n.gpu_passing else n.container_engine


def shared_gpus(n: pb.NodeInfo) -> str:
    """`GPU 3: 0.75 (3 jobs)` for each GPU that jobs below one GPU share."""
    on: dict[int, list[int]] = {}
    for a in n.assignments:
        if a.gpu_share_milli:
            on.setdefault(a.gpu_index, []).append(a.gpu_share_milli)
    return ", ".join(f"GPU {i}: {share_text(sum(m))} ({len(m)} job{'s' if len(m) > 1 else ''})"
                     for i, m in sorted(on.items()))


def _amount(exact: float, whole: int) -> str:
    """A queue's GPUs: whole numbers as such, fractions (shared GPUs) with up to three decimals."""
    if not exact:
        return str(whole)
    return share_text(round(exact * 1000)) if exact != int(exact) else str(int(exact))


def cmd_queues(args: argparse.Namespace) -> int:
    rm = connect(args)
    reply = pb.ListQueuesResponse()
    for page in rm.pages(rm.client.ListQueues, pb.ListQueuesRequest()):      # one page unless the tree is huge
        reply.queues.extend(page.queues)
        reply.by_size.extend(page.by_size)
        reply.capacity = page.capacity
        reply.borrowing, reply.borrowing_preemptions = page.borrowing, page.borrowing_preemptions
    if args.output == "json":
        print_json({"capacity": reply.capacity, "queues": [message_dict(q) for q in reply.queues],
                    "by_size": [message_dict(c) for c in reply.by_size], "borrowing": reply.borrowing or "fair",
                    "borrowing_preemptions": reply.borrowing_preemptions})
        return 0
    print_queue_table(reply.queues)
    print(f"capacity {reply.capacity} GPUs; {borrowing_text(reply)}")
    if reply.by_size:
        print()
        print_size_table(reply.by_size)
    return 0


def borrowing_text(reply: pb.ListQueuesResponse) -> str:
    """How GPUs beyond the queues' steady shares are ordered (queues.yaml `borrowing`, docs/queues.md)."""
    if reply.borrowing in ("", "fair"):
        return "borrowed GPUs go to the queue furthest below its share (borrowing: fair)"
    return (f"borrowed GPUs ordered by {reply.borrowing} across queues, "
            f"{reply.borrowing_preemptions} borrowers preempted")


def print_size_table(by_size: Iterable[pb.SizeClassQueueing]) -> None:
    """Queueing delay (submit to first start) by job size, over the jobs the RM holds."""
    table(["JOB SIZE (GPUs)", "STARTED", "AVG QUEUEING", "P99 QUEUEING", "WAITING", "LONGEST WAIT"],
          [[c.size, c.started, format_duration(c.mean_s) if c.started else "-",
            format_duration(c.p99_s) if c.started else "-", c.waiting,
            format_duration(c.longest_wait_s) if c.waiting else "-"] for c in by_size])


def print_queue_table(queues: Iterable[pb.QueueInfo]) -> None:
    rows = []
    for q in queues:
        depth = q.path.count(".")
        name = "  " * depth + q.path.rsplit(".", 1)[-1]
        rows.append([name, f"{q.weight:g}", q.min_gpus, "-" if q.max_gpus < 0 else q.max_gpus, q.steady_share,
                     q.instantaneous_share, _amount(q.used, q.used_gpus), _amount(q.pending, q.pending_gpus),
                     q.running_jobs, q.queued_jobs,
                     q.policy if q.leaf else "", "" if q.preemptible else "no",
                     format_duration(q.below_guarantee_s) if q.leaf and q.below_guarantee_s else ""])
    table(["QUEUE", "WEIGHT", "MIN", "MAX", "STEADY", "INSTANT", "USED", "PENDING", "RUN", "QUEUED", "POLICY",
           "PREEMPT", "BELOW GUARANTEE"], rows)


def cmd_refresh_queues(args: argparse.Namespace) -> int:
    text = ""
    if args.file:
        try:
            text = Path(args.file).read_text()
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
        if not text.strip():
            raise CliError(f"{args.file} is empty; a queue config needs at least one queue")
    rm = connect(args)
    reply = rm.call(rm.admin.RefreshQueues, pb.RefreshQueuesRequest(yaml=text))
    for warning in reply.warnings:
        sys.stderr.write(f"gpurm admin refresh-queues: warning: {warning}\n")
    if args.output == "json":
        print_json(reply)
        return 0 if reply.applied else 2
    if not reply.applied:
        raise CliError("queue config rejected, the old one stays in force:\n  " + "\n  ".join(reply.errors))
    print("queue config applied")
    print_queue_table(reply.queues)
    return 0


def cmd_check_queues(args: argparse.Namespace) -> int:
    """Validate a queues file offline and show the steady shares it gives a cluster of N GPUs."""
    from gpurm.common.fields import ConfigError
    from gpurm.queues.config import capacity_warnings, parse_queues
    from gpurm.queues.fairshare import compute_shares

    if args.capacity < 0:
        raise CliError(f"--capacity: must be at least 0, got {args.capacity}")
    try:
        text = Path(args.file).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    try:
        tree = parse_queues(text, args.file)
    except ConfigError as exc:
        if args.output == "json":
            print_json({"valid": False, "errors": exc.problems})
        else:
            sys.stderr.write(f"gpurm admin check-queues: {len(exc.problems)} problem(s) in {args.file}:\n")
            for problem in exc.problems:
                sys.stderr.write(f"  {problem}\n")
        return 2
    shares = compute_shares(tree.share_tree(), args.capacity)
    # Valid but over-promising for this capacity: said on stderr (the JSON on stdout keeps its shape), exit 0.
    for warning in capacity_warnings(tree, args.capacity):
        sys.stderr.write(f"gpurm admin check-queues: warning: {warning}\n")
    if args.output == "json":
        print_json({q.path: {"steady_share": shares.steady.get(q.path, 0), "weight": q.weight,
                             "min_gpus": q.min_gpus, "max_gpus": q.max_gpus, "leaf": q.leaf,
                             "preemptible": q.effective_preemptible,
                             "policy": q.effective_policy.value if q.leaf else None,
                             "max_running_jobs": q.max_running_jobs, "max_gpus_per_user": q.max_gpus_per_user,
                             "submit_acl": sorted(q.effective_submit), "admin_acl": sorted(q.effective_admin)}
                    for q in tree.walk()})
        return 0
    rows = []
    for q in tree.walk():
        depth = q.path.count(".")
        rows.append(["  " * depth + q.name, f"{q.weight:g}", q.min_gpus, "-" if q.max_gpus is None else q.max_gpus,
                     shares.steady.get(q.path, 0), q.effective_policy.value if q.leaf else "",
                     "" if q.effective_preemptible else "no", ",".join(sorted(q.effective_submit)) if q.leaf else ""])
    table(["QUEUE", "WEIGHT", "MIN", "MAX", "STEADY", "POLICY", "PREEMPT", "SUBMIT"], rows)
    print(f"{args.file} is valid; steady shares for a cluster of {args.capacity} GPUs")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    rm = connect(args)
    reply = rm.call(rm.admin.DrainNode, pb.DrainNodeRequest(node_id=args.node, undrain=args.undo))
    if args.output == "json":
        print_json(reply.node)
    else:
        print(f"{reply.node.node_id}: {NODE_STATES.get(reply.node.state, '?')}")
    return 0
