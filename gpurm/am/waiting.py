"""Why a job is pending, in words, for its status: what the AM waits for (the GPUs and their locality, or a spread
job's servers), the level's clock (time waited of its timeout), what it holds and which servers it still waits on,
where the free GPUs are, or the back-off it sits out and what it tries next. Rendered when a report goes out, not on
every step.

Functions of the `Master`; they change nothing but the attempt's waiting reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.acquire import level_deadline, missing_parts
from gpurm.am.levels import level_label, next_cap, next_level
from gpurm.am.placement import ServerView
from gpurm.am.records import Phase
from gpurm.common.fields import format_duration
from gpurm.common.jobspec import LocalityLevel, LocalityMode, share_text

if TYPE_CHECKING:
    from gpurm.am.master import Master


def refresh_waiting(m: Master, now: float) -> None:
    """Bring the attempt's waiting reason up to date (marking the attempt changed only when the words change)."""
    reason = why_waiting(m, now)
    if reason != m.attempt.waiting_reason:
        m.attempt.waiting_reason = reason
        m.dirty.add(m.attempt.number)


def why_waiting(m: Master, now: float) -> str:
    """Why the attempt is still waiting, at `now` (what `Master.waiting_reason` answers)."""
    if m.spec.image and not len(m.view):
        return ("waiting for a server that runs image jobs: no running server has a container engine (agent.yaml "
                "containers.engine; `gpurm nodes` shows IMAGES)")
    reason = _why_waiting(m, now)
    return f"{reason} (an image job: only servers with a container engine count)" if m.spec.image else reason


def _why_waiting(m: Master, now: float) -> str:
    if m.spread:
        return _why_waiting_spread(m, now)
    if m.spec.shared and m.phase is not Phase.BACKOFF:
        return (f"waiting for {share_text(m.spec.gpu_share_milli)} of a GPU: no shared GPU has that much room "
                f"and no GPU is free ({format_duration(now - m.level_since)})")
    gpus = m.spec.gpus
    level = m.level
    timeout = m.spec.locality.timeout_s if m.phase is Phase.BACKOFF else \
        max(0.0, level_deadline(m) - m.level_since)
    clock = f"level {level.label}, {format_duration(now - m.level_since)} of {format_duration(timeout)}"
    strict = m.spec.locality.mode is LocalityMode.STRICT
    if m.phase is Phase.BACKOFF:
        nxt = next_level(m)
        again = " again (locality strict: it never relaxes further)" if strict and nxt is level else \
            " again (it fits on one server: it is not split across servers unless its locality is any)" \
            if nxt is level and level is not LocalityLevel.ANY else ""
        return (f"backing off {format_duration(max(0.0, m.backoff_until - now))} after {level.label} "
                f"timed out; then trying {nxt.label}{again}")
    if strict:
        clock += " (locality strict: it waits here, never relaxing further)"
    if m.skipped:
        clock += f"; {m.skipped}"
    want = _describe_level(gpus, level, m.view.fewest_servers(gpus) if len(m.view) else 1)
    if m.phase is Phase.ACQUIRING and m.plan is not None:
        missing = missing_parts(m)
        waits = ", ".join(f"{p.node_id} ({p.gpus})" for p in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        return (f"waiting for {want}; {clock}; holding {m.held_gpus} of {gpus}, "
                f"waiting on {waits}{more}")
    return f"waiting for {want}; {clock}; {_best_hint(m, level)}"


def _why_waiting_spread(m: Master, now: float) -> str:
    """why_waiting for a `placement: spread` job: its cap of GPUs per server instead of a locality level."""
    gpus = m.spec.gpus
    label = level_label(m)
    strict = m.spec.locality.mode is LocalityMode.STRICT
    if m.phase is Phase.BACKOFF:
        nxt = next_cap(m)
        then = f"spread:{nxt}" if nxt else "spread:any"
        again = " again (locality strict: never more GPUs per server)" if strict and nxt == m.cap else \
            " again" if nxt == m.cap else ""
        return (f"backing off {format_duration(max(0.0, m.backoff_until - now))} after {label} timed out; "
                f"then trying {then}{again}")
    timeout = max(0.0, level_deadline(m) - m.level_since)
    clock = f"{label}, {format_duration(now - m.level_since)} of {format_duration(timeout)}"
    if strict:
        clock += " (locality strict: it waits here, never more GPUs per server)"
    per = "one GPU per server" if m.cap == 1 else f"at most {m.cap} per server" if m.cap else \
        "as many servers as are free"
    want = f"{gpus} GPUs spread, {per}"
    if m.phase is Phase.ACQUIRING and m.plan is not None:
        missing = missing_parts(m)
        waits = ", ".join(f"{p.node_id} ({p.gpus})" for p in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        return f"waiting for {want}; {clock}; holding {m.held_gpus} of {gpus}, waiting on {waits}{more}"
    usable = [s for s in m.view.servers if s.node_id not in m.avoid and s.free]
    limit = m.cap or gpus
    room = sum(min(len(s.free), limit) for s in usable)
    return (f"waiting for {want}; {clock}; {len(usable)} server{'s' if len(usable) != 1 else ''} with a free GPU "
            f"offer {room} of them")


def _best_hint(m: Master, level: LocalityLevel) -> str:
    """Where the free GPUs are, as far as they matter at `level`."""
    usable = [s for s in m.view.servers if s.node_id not in m.avoid]
    if not usable:
        return "no server is up"
    if level is LocalityLevel.NODE:
        best = max(usable, key=lambda s: (len(s.free), s.node_id))
        return f"the emptiest server, {best.node_id}, has {len(best.free)} free"
    if level is LocalityLevel.ANY:
        return f"{sum(len(s.free) for s in usable)} GPUs free in the whole cluster"
    by_domain: dict[str, list[ServerView]] = {}
    for s in usable:
        if s.free:
            by_domain.setdefault(s.domain, []).append(s)
    if not by_domain:
        return "no server has a free GPU"
    domain, members = max(by_domain.items(), key=lambda kv: (sum(len(s.free) for s in kv[1]), kv[0]))
    n = len(members)
    return (f"{n} server{'s' if n != 1 else ''} in rack {domain} hold "
            f"{sum(len(s.free) for s in members)} of them")


def _describe_level(gpus: int, level: LocalityLevel, fewest: int) -> str:
    if level is LocalityLevel.NODE:
        return f"{gpus} GPUs on one server"
    if level is LocalityLevel.PACKED:
        return f"{gpus} GPUs packed on {fewest} server{'s' if fewest != 1 else ''} in one rack"
    if level is LocalityLevel.RACK:
        return f"{gpus} GPUs in one rack"
    return f"{gpus} GPUs anywhere"
