"""Whom a container runs as, and the checks every one passes first (nodeagent/identity.py): pure, no sockets."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from gpurm.nodeagent.config import ConfigError, load_agent_config
from gpurm.nodeagent.identity import (
    DEFAULT_BANNED_USERS,
    RefusedUserError,
    RunAsMode,
    RunAsPolicy,
    UnknownUserError,
    UserRules,
    refusal,
    resolve_run_as,
    startup_note,
)

ACCOUNTS = {  # name: (uid, gid)
    "root": (0, 0), "daemon": (1, 1), "news": (9, 9), "nobody": (65534, 65534), "alice": (1001, 1001),
    "toor": (1500, 1500), "wheelie": (1600, 0), "svc": (999, 999),
}


def passwd(name: str, uid: int, gid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", f"/home/{name}", "/bin/sh"))


def getpwnam(name: str) -> pwd.struct_passwd:
    if name not in ACCOUNTS:
        raise KeyError(name)
    return passwd(name, *ACCOUNTS[name])


def getpwuid(uid: int) -> pwd.struct_passwd:
    for name, (u, g) in ACCOUNTS.items():
        if u == uid:
            return passwd(name, u, g)
    raise KeyError(uid)


def getgrouplist(name: str, gid: int) -> list[int]:
    return [gid, 27] if name != "toor" else [gid, 0]   # toor: uid 1500 but in group 0


def resolve(user: str, policy: RunAsPolicy, agent_uid: int = 0) -> object:
    return resolve_run_as(user, policy, agent_uid=agent_uid, getpwnam=getpwnam, getpwuid=getpwuid,
                          getgrouplist=getgrouplist)


SECURE = RunAsPolicy(secure=True)
INSECURE = RunAsPolicy(secure=False)


@pytest.mark.parametrize(("user", "why"), [
    ("root", "is root"), ("daemon", "containers.banned_users"), ("news", "below containers.min_uid 1000"),
    ("svc", "below containers.min_uid 1000"), ("toor", "group 0"), ("wheelie", "group 0"),
])
def test_mtls_refuses_root_system_banned_and_root_group_users(user: str, why: str) -> None:
    with pytest.raises(RefusedUserError) as info:
        resolve(user, SECURE)
    text = str(info.value)
    assert f"user {user!r} (uid {ACCOUNTS[user][0]})" in text and why in text, text


def test_the_diagnostic_says_what_to_do() -> None:
    rules = UserRules()
    assert refusal("news", 9, 9, (), rules).endswith(
        "run as a user with uid >= 1000, or set containers.min_uid in agent.yaml")
    assert "remove it from containers.banned_users" in refusal("daemon", 1, 1, (), rules)
    assert "uid >= 1000" in refusal("root", 0, 0, (), rules)
    assert refusal("alice", 1001, 1001, (1001, 27), rules) == ""


def test_uid_0_is_refused_whatever_min_uid_and_banned_users_say() -> None:
    lax = UserRules(min_uid=1, banned_users=frozenset())
    assert "is root" in refusal("root", 0, 0, (), lax)
    assert "is root" in refusal("toor", 0, 1500, (), lax)   # another name for uid 0
    assert refusal("news", 9, 9, (), lax) == ""             # a site that lowered min_uid allows it


def test_a_banned_user_is_refused_even_above_min_uid() -> None:
    rules = UserRules(banned_users=frozenset({"alice"}))
    with pytest.raises(RefusedUserError, match=r"containers.banned_users"):
        resolve("alice", RunAsPolicy(secure=True, rules=rules))


def test_mtls_runs_the_job_as_its_own_user() -> None:
    who = resolve("alice", SECURE)
    assert (who.user, who.uid, who.gid, who.groups) == ("alice", 1001, 1001, (27, 1001))  # type: ignore[attr-defined]


def test_mtls_with_an_unknown_or_missing_user_is_the_nodes_problem() -> None:
    with pytest.raises(UnknownUserError, match=r"user 'mallory' does not exist on this node"):
        resolve("mallory", SECURE)
    with pytest.raises(UnknownUserError, match=r"names no user"):
        resolve("", SECURE)


@pytest.mark.parametrize("claimed", ["root", "daemon", "alice", "mallory", ""])
def test_insecure_mode_never_runs_the_claimed_user(claimed: str) -> None:
    who = resolve(claimed, INSECURE)
    assert (who.user, who.uid) == ("nobody", 65534)  # type: ignore[attr-defined]


def test_insecure_mode_runs_the_configured_local_user_and_checks_it() -> None:
    assert resolve("root", RunAsPolicy(local_user="alice")).user == "alice"  # type: ignore[attr-defined]
    with pytest.raises(RefusedUserError, match=r"containers.local_user: user 'root' .* is root"):
        resolve("alice", RunAsPolicy(local_user="root"))
    with pytest.raises(UnknownUserError, match=r"containers.local_user 'ghost' does not exist"):
        resolve("alice", RunAsPolicy(local_user="ghost"))


def test_mtls_with_an_explicit_local_user_runs_every_job_as_it() -> None:
    assert resolve("root", RunAsPolicy(secure=True, local_user="nobody")).user == "nobody"  # type: ignore[attr-defined]


def test_a_root_agent_with_run_as_agent_starts_nothing() -> None:
    with pytest.raises(RefusedUserError, match=r"run_as: agent and the agent runs as root"):
        resolve("alice", RunAsPolicy(mode=RunAsMode.AGENT, secure=True))
    ok, note = startup_note(RunAsPolicy(mode=RunAsMode.AGENT), agent_uid=0)
    assert not ok and "no container will start" in note


def test_a_non_root_agent_runs_everything_as_itself() -> None:
    for policy in (SECURE, INSECURE, RunAsPolicy(mode=RunAsMode.AGENT)):
        who = resolve("root", policy, agent_uid=1001)
        assert (who.user, who.switches) == ("alice", False)  # type: ignore[attr-defined]
    ok, note = startup_note(INSECURE, agent_uid=1001, getpwuid=getpwuid)
    assert ok and "every container runs as alice" in note


def test_an_agent_running_as_a_system_user_starts_nothing() -> None:
    with pytest.raises(RefusedUserError, match=r"the agent runs as daemon, not root.*containers.banned_users"):
        resolve("alice", INSECURE, agent_uid=1)
    with pytest.raises(RefusedUserError, match=r"the agent runs as news, not root.*below containers.min_uid"):
        resolve("alice", SECURE, agent_uid=9)
    ok, note = startup_note(INSECURE, agent_uid=9, getpwuid=getpwuid)
    assert not ok and "no container will start" in note and "news" in note


def test_startup_notes_name_the_mode() -> None:
    assert "insecure mode" in startup_note(INSECURE, agent_uid=0)[1]
    assert "never as the user a client claims" in startup_note(INSECURE, agent_uid=0)[1]
    assert "client's certificate" in startup_note(SECURE, agent_uid=0)[1]


# ---------------------------------------------------------------- agent.yaml keys

BASE = {"gpus": {"fake": 1}, "memory_mib": 1000}


def test_identity_keys_and_defaults() -> None:
    cc = load_agent_config(None, BASE, euid=0).containers
    assert (cc.min_uid, cc.banned_users, cc.local_user) == (1000, DEFAULT_BANNED_USERS, "")
    assert "nobody" not in cc.banned_users and "root" in cc.banned_users
    cfg = load_agent_config(None, {**BASE, "containers": {"min_uid": 500, "banned_users": ["bob"],
                                                           "local_user": "svc-gpu"}}, euid=0)
    policy = cfg.run_as_policy()
    assert (policy.rules.min_uid, policy.rules.banned_users, policy.local_user, policy.secure) == (
        500, frozenset({"bob"}), "svc-gpu", False)


def test_bad_identity_keys_are_named() -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, {**BASE, "containers": {"min_uid": 0, "banned_users": ["ok", "no/slash"],
                                                         "local_user": "../x"}}, euid=0)
    text = "\n".join(info.value.problems)
    for key in ("containers.min_uid", "containers.banned_users", "containers.local_user"):
        assert key in text, text


def test_a_non_root_agent_cannot_name_another_local_user() -> None:
    me = pwd.getpwuid(1001).pw_name if _exists(1001) else "1001"
    with pytest.raises(ConfigError, match=r"containers.local_user: the agent runs as .* not root"):
        load_agent_config(None, {**BASE, "containers": {"local_user": "somebody-else"}}, euid=1001)
    assert load_agent_config(None, {**BASE, "containers": {"local_user": me}}, euid=1001).containers.local_user == me


def test_local_user_and_run_as_agent_conflict() -> None:
    with pytest.raises(ConfigError, match=r"containers.local_user: cannot be used with run_as: agent"):
        load_agent_config(None, {**BASE, "containers": {"local_user": "nobody", "run_as": "agent"}}, euid=0)


def test_am_tls_needs_tls_and_is_required_for_a_root_agent_with_tls(tmp_path: Path) -> None:
    cert, key = "-----BEGIN CERTIFICATE-----\nx\n", "-----BEGIN PRIVATE KEY-----\nx\n"
    for name, text in (("ca.pem", cert), ("node.pem", cert), ("node.key", key), ("am.pem", cert), ("am.key", key)):
        (tmp_path / name).write_text(text)
    tls = {"ca": str(tmp_path / "ca.pem"), "cert": str(tmp_path / "node.pem"), "key": str(tmp_path / "node.key")}
    am_tls = {"cert": str(tmp_path / "am.pem"), "key": str(tmp_path / "am.key")}
    with pytest.raises(ConfigError, match=r"am_tls: is only used with tls"):
        load_agent_config(None, {**BASE, "am_tls": am_tls}, euid=0)
    with pytest.raises(ConfigError, match=r"am_tls: is required with tls when the agent runs as root"):
        load_agent_config(None, {**BASE, "tls": tls}, euid=0)
    assert load_agent_config(None, {**BASE, "tls": tls}, euid=1001).am_tls is None  # AMs run as the agent
    cfg = load_agent_config(None, {**BASE, "tls": tls, "am_tls": am_tls}, euid=0)
    assert cfg.am_tls is not None and cfg.tls is not None
    assert (cfg.am_tls.ca, cfg.am_tls.cert, cfg.am_tls.key) == (cfg.tls.ca, tmp_path / "am.pem", tmp_path / "am.key")
    with pytest.raises(ConfigError, match=r"am_tls.key: cannot read"):
        load_agent_config(None, {**BASE, "tls": tls, "am_tls": {**am_tls, "key": str(tmp_path / "nope")}}, euid=0)


def _exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
