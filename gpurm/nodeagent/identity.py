"""Which Unix user a container runs as, and the checks every one must pass first.

The agent is the last line of defence (like YARN's container-executor with `banned.users` / `min.user.id`):
whoever asks and whatever the RM's token says, it never starts a process (learner or AM) as

- uid 0, or a user whose primary or supplementary groups include group 0;
- a uid below `containers.min_uid` (default 1000: system accounts; `nobody`, 65534, is allowed);
- a user named in `containers.banned_users` (default DEFAULT_BANNED_USERS).

Such a container fails to start as the job's failure, not the node's (`RefusedUserError`, FAILED_TO_START
without infra_failure, so no AM retries it on another node forever), its diagnostic naming the user, why and
the fix. The container's launcher (`shim.py`) refuses uid 0 again on its own.

Whom a container runs as (`RunAsPolicy`):

- the agent is not root: its own user, always (it cannot switch); that uid must pass the checks too, so an agent
  running as a system user starts nothing (one line at start-up, a diagnostic per container);
- the agent is root, with mTLS (`tls` in agent.yaml): the job's user from the container token, which the RM took
  from the client's certificate; the account must exist on this node (else an infrastructure failure). Where
  `containers.local_user` is set explicitly, every container runs as that user instead (one service account
  for all jobs, e.g. a cluster whose certificate names have no accounts on the nodes);
- the agent is root, insecure mode (no `tls`): the job's user is only the client's claim, so every container
  runs as one local user, `containers.local_user` (default `nobody`), never as the claimed user (YARN's
  non-secure `local-user`);
- `containers.run_as: agent` (the old way to run every job as the agent's user): as the agent's own user; for a
  root agent that is uid 0, so nothing starts (use `local_user` instead).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

DEFAULT_MIN_UID = 1000
# Accounts that own the system: never a job's user even where a site lowers min_uid. `nobody` is not here: it
# owns nothing and is the default local_user of a root agent in insecure mode.
DEFAULT_BANNED_USERS = ("root", "daemon", "bin", "sys", "adm", "sync", "shutdown", "halt", "operator", "lp",
                        "mail", "sshd")
DEFAULT_LOCAL_USER = "nobody"


class RunAsMode(Enum):
    USER = "user"      # the job's user under mTLS, containers.local_user in insecure mode (agent running as root)
    AGENT = "agent"    # always the agent's own user


class UnknownUserError(Exception):
    """The container's user does not exist on this node: the node's problem (an infrastructure failure)."""


class RefusedUserError(Exception):
    """The container's user is root, a system account or banned: the job fails (not retried on other nodes)."""


@dataclass(frozen=True)
class UserRules:
    min_uid: int = DEFAULT_MIN_UID
    banned_users: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_BANNED_USERS))


@dataclass(frozen=True)
class RunAsPolicy:
    mode: RunAsMode = RunAsMode.USER
    secure: bool = False    # mTLS: the token's user is the client's certificate name, not a claim
    local_user: str = ""    # the one user of every container ('' = the job's user with mTLS, else nobody)
    rules: UserRules = field(default_factory=UserRules)


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


def refusal(user: str, uid: int, gid: int, groups: Iterable[int], rules: UserRules) -> str:
    """Why no process may run as this user ('' when it may): one line naming the user, the reason and the fix."""
    who = f"user {user!r} (uid {uid})"
    fix = f"run as a user with uid >= {rules.min_uid}, or set containers.min_uid in agent.yaml"
    if uid == 0:
        return (f"{who} is root: the agent never runs a container as root; run as a user with uid >= "
                f"{rules.min_uid}")
    if user in rules.banned_users:
        return (f"{who} is in containers.banned_users: the agent never runs a container as a system account; "
                f"run as another user, or remove it from containers.banned_users in agent.yaml")
    if uid < rules.min_uid:
        return f"{who} is below containers.min_uid {rules.min_uid} (a system account); {fix}"
    if gid == 0 or 0 in set(groups):
        return (f"{who} is in group 0 (root): the agent never runs a container with root's group; run as a "
                f"user outside group 0")
    return ""


def switching(policy: RunAsPolicy, agent_uid: int | None = None) -> bool:
    """Whether containers run as another user than the agent's (only a root agent can switch)."""
    uid = os.geteuid() if agent_uid is None else agent_uid
    return uid == 0 and policy.mode is RunAsMode.USER


def local_user(policy: RunAsPolicy, agent_uid: int | None = None) -> str:
    """Insecure mode's user: containers.local_user, else `nobody` for a root agent, else the agent's user."""
    uid = os.geteuid() if agent_uid is None else agent_uid
    if uid != 0:
        return agent_user(uid)
    return policy.local_user or DEFAULT_LOCAL_USER


def startup_note(policy: RunAsPolicy, agent_uid: int | None = None, *,
                 getpwuid: Callable[[int], pwd.struct_passwd] = pwd.getpwuid) -> tuple[bool, str]:
    """(ok, one line for the agent log saying whom containers run as); ok is False when none can start."""
    uid = os.geteuid() if agent_uid is None else agent_uid
    if uid == 0 and policy.mode is RunAsMode.AGENT:
        return False, ("containers.run_as: agent and the agent runs as root: no container will start (never as "
                       "root); remove run_as (jobs then run as containers.local_user, default nobody, or as "
                       "their user with mTLS)")
    if uid != 0:
        try:
            entry = getpwuid(uid)
            me, gid = entry.pw_name, entry.pw_gid
        except KeyError:
            me, gid = str(uid), os.getegid() if agent_uid is None else -1
        why = refusal(me, uid, gid, (), policy.rules)
        if why:
            return False, (f"the agent runs as {me}, not root, and can only run containers as itself, but "
                           f"{why}: no container will start; run the agent as root or as such a user")
        return True, (f"the agent runs as {me}, not root: every container runs as {me}, whoever submitted the job "
                      f"(run the agent as root to run jobs as their users)")
    if policy.secure and not policy.local_user:
        return True, ("containers run as their job's user, named by the client's certificate (mTLS); never as "
                      f"root, a banned user or a uid below {policy.rules.min_uid}")
    if policy.secure:
        return True, f"every container runs as {policy.local_user} (containers.local_user), whoever its job's user"
    return True, (f"insecure mode (no tls in agent.yaml): every container runs as {local_user(policy, uid)} "
                  f"(containers.local_user), never as the user a client claims")


def resolve_run_as(user: str, policy: RunAsPolicy, *, agent_uid: int | None = None,
                   getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
                   getpwuid: Callable[[int], pwd.struct_passwd] = pwd.getpwuid,
                   getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist) -> RunAs:
    """Whom a container of job user `user` runs as. RefusedUserError when that is root, a system account or a
    banned user; UnknownUserError when the account does not exist here. Pure given its lookups."""
    uid = os.geteuid() if agent_uid is None else agent_uid
    if uid == 0 and policy.mode is RunAsMode.AGENT:
        raise RefusedUserError("containers.run_as: agent and the agent runs as root: the agent never runs a "
                               "container as root; remove containers.run_as from agent.yaml")
    if uid != 0:
        try:
            entry = getpwuid(uid)
            name, gid, home = entry.pw_name, entry.pw_gid, entry.pw_dir
        except KeyError:
            name, gid, home = str(uid), os.getegid(), ""
        why = refusal(name, uid, gid, (), policy.rules)
        if why:
            raise RefusedUserError(f"the agent runs as {name}, not root, and can only run containers as itself, "
                                   f"but {why}")
        return RunAs(user=name, home=home)
    honoured = policy.secure and not policy.local_user   # the job's own (authenticated) user
    if honoured:
        if not user:
            raise UnknownUserError("the container names no user; the agent runs as root and will not run a job "
                                   "without one")
        name = user
    else:
        name = local_user(policy, uid)
    try:
        entry = getpwnam(name)
    except KeyError:
        if honoured:
            raise UnknownUserError(f"user {name!r} does not exist on this node (with mTLS a job runs as its "
                                   f"user; add the account here, e.g. through LDAP / SSSD)") from None
        raise UnknownUserError(f"containers.local_user {name!r} does not exist on this node (every job runs as "
                               f"it); create the account or set containers.local_user in agent.yaml") from None
    try:
        groups = tuple(sorted(set(getgrouplist(name, entry.pw_gid))))
    except OSError as exc:
        raise UnknownUserError(f"cannot read the groups of user {name!r}: {exc.strerror or exc}") from None
    why = refusal(name, entry.pw_uid, entry.pw_gid, groups, policy.rules)
    if why:
        if not honoured:
            why = f"containers.local_user: {why}"
        raise RefusedUserError(why)
    return RunAs(user=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)

