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


def make_plan(m: Master, view: View | None = None) -> Plan | None:
    """A plan at the current level (a spread job's: under its cap) from the view (the AM's own unless given);
    None when nothing fits."""
    if m.spec.shared:
        # A share of one GPU: the RM knows which shared GPUs have room (the view shows whole GPUs only), so the
        # plan names no server.
        return Plan(LocalityLevel.ANY, [Part("", "", (0,))])
    if m.spread:
        return plan_spread(m.spec.gpus, view or m.view, m.cap, m.avoid, m.salt)
    return plan(m.spec.gpus, view or m.view, m.level, m.avoid, m.salt)


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


def stuck_at_last_level(m: Master, view: View | None = None) -> bool:
    """Idle (planning with no plan, or backing off; holding nothing) at the last level it will try (`any`; a
    strict job's own level; `packed` for a job kept on one server), in a view (the AM's own unless given) where
    the plan at that level fails. Then every cycle of back-off, plan and time-out fails alike until the view gains
    free GPUs: the plan reads only the view, the level, the servers to avoid and the salt, and none of these a
    cycle changes. The cheap tests first; the plan last (a failed plan is remembered per view, so the AMs waiting
    on one view pay for it once)."""
    if m.held or m.spec.shared or m.level is not next_level(m):
        return False
    if m.phase is not Phase.BACKOFF and (m.phase is not Phase.PLANNING or m.plan is not None):
        return False
    if shape_floor(m, m.level) is not m.level or (m.spread and (next_cap(m) != m.cap
                                                                or cap_floor(m, m.cap) != m.cap)):
        return False         # the next cycle would move the level or the cap: step through it
    view = view or m.view
    if view.cannot_fit(m.spec.gpus, m.level):
        return True
    if not m.spread and not m.avoid:
        fits = view.fits(m.spec.gpus, m.level)
        if fits is not None:
            return not fits
    return make_plan(m, view) is None


def idle_at_last_level(m: Master) -> bool:
    """Backing off, stuck at its last level in its own view (stuck_at_last_level): catch_up may skip its cycles."""
    return m.phase is Phase.BACKOFF and stuck_at_last_level(m)


def skip_idle_cycles(m: Master, now: float) -> None:
    """Back-off → plan at the last level (nothing fits) → time out → back-off, as many whole cycles as end before
    `now`, without planning: stuck_at_last_level proved every plan on this view fails. Same clock, random draws
    and records as stepping through them; a job waiting for days in a full cluster would otherwise replan
    hundreds of times."""
    timeout = m.spec.locality.timeout_s
    if m.backoff_until + timeout <= now:
        m.skipped = ""       # what entering the level again says: the level is its own shape floor
    while m.backoff_until + timeout <= now:
        m.level_since = m.backoff_until
        cap = backoff_cap(m)
        m.backoffs += 1
        m.backoff_until = m.level_since + timeout + m.rng.uniform(0.0, cap)
    if m.backoff_until <= now:
        m.step(m.backoff_until)        # the last back-off ends before now: plan (and fail) for real
    m.attempt.level = level_label(m)
    m.dirty.add(m.attempt.number)
