"""Acquiring a gang within a locality level's time: the plan at the current level, what of it is still missing
(asks), whether a grant fits it, whether others took its servers; the level's clock (its timeout, or with a
`CostRelax` what it saves), entering a level, giving one up and the back-off that follows (base x 2^k with full
jitter, capped), and skipping whole idle back-off cycles when the view proves every plan would fail.

Functions of the `Master` (its fields are the state); which level comes next is am/levels.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.levels import cap_floor, level_label, next_cap, next_level, shape_floor, why_skipped
from gpurm.am.placement import Part, Plan, View, plan, plan_spread
from gpurm.am.records import Held, Phase
from gpurm.common.jobspec import LocalityLevel

if TYPE_CHECKING:
    from gpurm.am.master import Master


def make_plan(m: Master) -> Plan | None:
    """A plan at the current level (a spread job's: under its cap) from the view; None when nothing fits."""
    if m.spec.shared:
        # A share of one GPU: the RM knows which shared GPUs have room (the view shows whole GPUs only), so the
        # plan names no server.
        return Plan(LocalityLevel.ANY, [Part("", "", (0,))])
    if m.spread:
        return plan_spread(m.spec.gpus, m.view, m.cap, m.avoid, m.salt)
    return plan(m.spec.gpus, m.view, m.level, m.avoid, m.salt)


def missing_parts(m: Master) -> list[Part]:
    """The parts of the plan that no held grant matches yet (what is still asked for)."""
    assert m.plan is not None
    if not m.held:
        return list(m.plan.parts)
    free = list(m.held.values())
    missing = []
    for part in m.plan.parts:
        match = next((h for h in free if part.node_id in ("", h.node_id) and h.gpus == part.gpus), None)
        if match is not None:
            free.remove(match)
        else:
            missing.append(part)
    return missing


def is_wanted(m: Master, held: Held) -> bool:
    """Whether a grant matches a missing part of the plan."""
    if m.plan is None:
        return False
    return any(p.node_id in ("", held.node_id) and p.gpus == held.gpus for p in missing_parts(m))


def plan_taken(m: Master, view: View | None = None) -> bool:
    """Whether the view shows a server of the plan without the GPUs the plan needs there."""
    if m.plan is None:
        return False
    free_on = (view or m.view).free_on
    return any(p.node_id and free_on.get(p.node_id, 0) < p.gpus for p in m.plan.parts)


def level_deadline(m: Master) -> float:
    """When the current level is given up: its timeout, or with a cost policy (and a looser level to go to)
    when the time waited reaches the run time the level saves (am/relax.py)."""
    timeout_at = m.level_since + m.spec.locality.timeout_s
    if m.relax is None:
        return timeout_at
    nxt = shape_floor(m, next_level(m))
    if nxt is m.level:
        return timeout_at
    return m.relax.deadline(m.level, nxt, m.level_since, m.view, m.spec.gpus, m.frees)


def enter_level(m: Master, level: LocalityLevel, now: float) -> None:
    wanted = level
    level = shape_floor(m, level)      # a level the job can never be at is skipped at once
    m.skipped = why_skipped(m, wanted, level) if level is not wanted else ""
    m.level = level
    if m.spread:
        m.cap = cap_floor(m, m.cap)
    m.level_since = now
    m.plan = None
    m.phase = Phase.PLANNING
    m.attempt.level = level_label(m)
    m.dirty.add(m.attempt.number)


def give_up_level(m: Master, now: float) -> None:
    m.releases.extend(m.held)
    m.held.clear()
    m.plan = None
    cap = backoff_cap(m)
    m.backoffs += 1
    m.backoff_until = now + m.rng.uniform(0.0, cap)
    m.phase = Phase.BACKOFF


def backoff_cap(m: Master) -> float:
    # 2^k stops growing long before it matters (and before it overflows a float): the cap rules.
    loc = m.spec.locality
    return float(min(loc.backoff_base_s * (2 ** min(m.backoffs, 60)), loc.backoff_max_s))


def idle_at_any(m: Master) -> bool:
    """Backing off at the last level it will try (`any`; a strict job's own level), holding nothing, in a
    view where nothing fits at that level."""
    return (m.phase is Phase.BACKOFF and m.level is next_level(m) and not m.held
            and m.view.cannot_fit(m.spec.gpus, m.level)
            and (not m.spread or next_cap(m) == m.cap))


def skip_idle_cycles(m: Master, now: float) -> None:
    """Back-off → plan at the last level (nothing fits) → time out → back-off, as many whole cycles as end before
    `now`, without planning: the view proves every plan would fail. Same clock and random draws as stepping
    through them; a job waiting for days in a full cluster would otherwise replan hundreds of times."""
    timeout = m.spec.locality.timeout_s
    while m.backoff_until + timeout <= now:
        m.level_since = m.backoff_until
        cap = backoff_cap(m)
        m.backoffs += 1
        m.backoff_until = m.level_since + timeout + m.rng.uniform(0.0, cap)
    if m.backoff_until <= now:
        m.step(m.backoff_until)        # the last back-off ends before now: plan (and fail) for real
    m.attempt.level = level_label(m)
    m.dirty.add(m.attempt.number)
