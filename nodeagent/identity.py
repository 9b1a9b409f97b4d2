"""Which Unix user a container runs as.

`containers.run_as: user` (the default): an agent running as root runs each container as the user who submitted
the job (setgroups to the user's groups, setgid, setuid, in the launcher before exec); a user unknown on this
node refuses the start as an infrastructure failure with a clear diagnostic. An agent that is not root cannot
switch: every container runs as the agent's own user (logged once at startup). `run_as: agent` never switches.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class RunAsMode(Enum):
    USER = "user"      # the submitting user when the agent is root, else the agent's user
    AGENT = "agent"    # always the agent's user


class UnknownUserError(Exception):
    """The container's user does not exist on this node (or none was given where one is needed)."""


@dataclass(frozen=True)
class RunAs:
    user: str                          # who the container runs as (for logs and the record)
    uid: int | None = None             # None: no switch (the agent's own user)
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    home: str = ""

    @property
    def switches(self) -> bool:
        return self.uid is not None


def agent_user(uid: int | None = None) -> str:
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def switching(mode: RunAsMode, agent_uid: int | None = None) -> bool:
    """Whether containers run as their submitting user under this mode and agent uid."""
    uid = os.geteuid() if agent_uid is None else agent_uid
    return mode is RunAsMode.USER and uid == 0


def startup_note(mode: RunAsMode, agent_uid: int | None = None) -> str:
    """One line for the agent log saying whom containers run as."""
    me = agent_user(agent_uid)
    if switching(mode, agent_uid):
        return "containers run as their job's submitting user (the agent runs as root)"
    if mode is RunAsMode.AGENT:
        return f"containers run as the agent's user {me} (containers.run_as: agent)"
    return (f"the agent runs as {me}, not root: every container runs as {me}, whoever submitted the job "
            f"(run the agent as root to run jobs as their users)")


def resolve_run_as(user: str, mode: RunAsMode, *, agent_uid: int | None = None,
                   getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
                   getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist) -> RunAs:
    """Whom a container of `user` runs as; UnknownUserError (one clear line) when it cannot run."""
    if not switching(mode, agent_uid):
        return RunAs(user=agent_user(agent_uid))
    if not user:
        raise UnknownUserError("the container names no user; the agent runs as root and will not run a job "
                               "without one")
    try:
        entry = getpwnam(user)
    except KeyError:
        raise UnknownUserError(f"user {user!r} does not exist on this node (the job runs as its submitting "
                               f"user; add the account here, e.g. through LDAP / SSSD)") from None
    try:
        groups = tuple(sorted(set(getgrouplist(user, entry.pw_gid))))
    except OSError as exc:
        raise UnknownUserError(f"cannot read the groups of user {user!r}: {exc.strerror or exc}") from None
    return RunAs(user=user, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)

