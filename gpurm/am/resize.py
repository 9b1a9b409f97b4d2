"""An elastic job's size while it runs: its asks to grow toward its target (where: am/elastic.py), the RM's target
taken (`gpurm scale`: below the live size, the newest grown learners are stopped and given back, never the gang),
and a grown learner let go. Growth joins a running job only, never a finishing one; launching a grown learner is
am/launch.py's.

Functions of the `Master` (its fields are the state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.attempts import live_runs, sync_learners
from gpurm.am.elastic import growth_parts
from gpurm.am.records import Phase, Run, Stop
from gpurm.common.jobspec import LocalityLevel, LocalityMode

if TYPE_CHECKING:
    from gpurm.am.master import Master

GROWTH_PAUSE_S = 60.0          # an elastic job's growth waits this long after a grown learner failed
SHRINK_GRACE_S = 30.0          # notice to a grown learner the job's own target no longer wants


def asks_to_grow(m: Master, now: float) -> list[tuple[str, int, tuple[int, ...]]]:
    """An elastic job's asks to grow toward its target (sent as elastic asks): only while it runs."""
    if not m.spec.elastic or m.phase is not Phase.RUNNING or now < m.growth_paused_until:
        return []
    if not gang_runs(m):
        return []                   # a learner of its gang has ended: the job is finishing, not growing
    live = live_runs(m)
    gang = [r for r in live if not r.extra]
    master = min(gang, key=lambda r: r.rank).held.node_id
    level = LocalityLevel.parse(m.attempt.level) if m.attempt.level else m.level
    if m.spec.locality.mode is LocalityMode.ANY:
        level = LocalityLevel.ANY
    return growth_parts(m.view, m.target - m.live_gpus,
                        [r.held.node_id for r in live], master, level, m.avoid)


def apply_target(m: Master, gpus: int) -> None:
    """The RM's target for an elastic job (0: its max). Above the live size, growth asks for more; below it,
    the newest grown learners are stopped and given back (never the gang)."""
    if not m.spec.elastic:
        return
    m.target = min(max(gpus or m.spec.max_gpus, m.spec.gpus), m.spec.max_gpus)
    if m.phase is not Phase.RUNNING:
        return
    size = m.live_gpus
    for run in sorted((r for r in live_runs(m) if r.extra), key=lambda r: -r.rank):
        if size <= m.target or size - run.held.gpus < m.target:
            break
        size -= run.held.gpus
        drop_extra(m, run, f"scaled to {m.target} GPUs", SHRINK_GRACE_S)


def gang_runs(m: Master) -> bool:
    """Whether every learner of the gang still runs (growth joins a running job, never a finishing one)."""
    gang = [r for r in m.runs.values() if not r.extra]
    return bool(gang) and all(r.live for r in gang)


def drop_extra(m: Master, run: Run, reason: str, grace_s: float) -> None:
    """Let a grown learner go: stop it and give its container back; the job goes on with the others."""
    run.state = "EXITED"
    m.actions.append(Stop(run.held, grace_s, reason))
    m.releases.append(run.held.container_id)
    sync_learners(m)
