"""Who may do what beyond a queue's own ACL checks: an RM admin (rm.yaml `admins`; without mTLS only from the RM's
own host), who may see a job's private parts (env values, logs), and the OS groups of a user on the RM host for
`@group` ACL entries, cached for a minute. Who is calling is decided before: rm/security/identity.py.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import time
from collections.abc import Callable

from gpurm.common.model import Job
from gpurm.rm.config import RMConfig
from gpurm.rm.security.identity import Caller, CallerKind
from gpurm.rm.state.core import RMCore

GROUPS_TTL_S = 60.0     # how long a user's OS groups are taken from the cache


class Access:
    def __init__(self, config: RMConfig, core: Callable[[], RMCore]) -> None:
        """`core`: the shell's core now (a failed write replaces it)."""
        self.config = config
        self._core = core
        self._groups: dict[str, tuple[float, list[str]]] = {}

    def is_admin(self, who: Caller) -> bool:
        """An RM admin: named in rm.yaml `admins` and, without mTLS, calling from the RM's own host."""
        return who.kind is CallerKind.USER and who.name in self.config.admins and (who.verified or who.local)

    def may_see(self, who: Caller, job: Job) -> bool:
        """Whether `who` may see a job's private parts (env values, logs): its owner, its queue's admins, RM
        admins."""
        if who.kind is not CallerKind.USER:
            return False
        return self.is_admin(who) or self._core().may_kill(job, who.name, self.groups_of(who.name))

    def groups_of(self, user: str) -> list[str]:
        """The OS groups of `user` on the RM host (for @group ACL entries), cached for a minute."""
        cached = self._groups.get(user)
        now = time.monotonic()
        if cached is not None and now - cached[0] < GROUPS_TTL_S:
            return cached[1]
        names: list[str] = []
        try:
            pw = pwd.getpwnam(user)
            for gid in os.getgrouplist(user, pw.pw_gid):
                with contextlib.suppress(KeyError):
                    names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
        self._groups[user] = (now, names)
        return names
