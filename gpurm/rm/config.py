"""rm.yaml: the RM daemon's configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpurm.common.fields import ConfigError, Problems, Reader, parse_address, parse_duration
from gpurm.common.lease import beats_for_lease, fence_timing, takeover_lease_s
from gpurm.common.limits import ServerLimits, read_limits
from gpurm.common.retry import AM_POLICY
from gpurm.common.tls import TLSConfig, read_tls_section
from gpurm.rm.forecast.config import ForecastConfig, read_forecast_section
from gpurm.rm.sched.behind import MAX_BEHIND
from gpurm.rm.sched.history import LEVELS
from gpurm.rm.sched.prior import PriorError, load_prior
from gpurm.rm.sched.priority import las_thresholds_problem
from gpurm.rm.server.leadership import takeover_within_s
from gpurm.rm.state.heartbeats import terms_at
from gpurm.rm.state.messages import RMSettings
from gpurm.rm.state.retention import MIN_MEMORY_S, NEVER, RetentionSettings
from gpurm.rm.storage.url import parse_store_url


def default_state_dir(component: str) -> Path:
    """/var/lib/gpurm/<component> for root, else under $XDG_STATE_HOME (~/.local/state)."""
    if os.geteuid() == 0:
        return Path("/var/lib/gpurm") / component
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpurm" / component


HTTP_PORT = 7080                 # the web UI and REST API's default port (docs/http.md)
MAX_HTTP_BODY = 1 << 20          # bytes of an HTTP request body (a job spec's command and env fit: docs/http.md)
MAX_RESERVATIONS = 64           # scheduler.reservations: more would drain much of a cluster for the jobs that wait
MAX_BEAT_INTERVAL_S = 600.0     # heartbeat.max_interval: a server silent 10 x this long is LOST (100 minutes)


@dataclass
class HTTPConfig:
    """rm.yaml `http:`: the web UI and REST API (gpurm/rm/http/), served in the RM's own event loop."""
    enabled: bool = True
    listen: str = f"127.0.0.1:{HTTP_PORT}"   # port 0 picks a free one (the RM logs and reports the URL)
    max_body_bytes: int = MAX_HTTP_BODY


@dataclass
class HAConfig:
    """rm.yaml `ha:`: this RM is one of several on one PostgreSQL store; one leads, the others stand by."""

    enabled: bool = False
    lease_s: float = 5.0       # a leader that stops renewing loses the lead after this (a takeover: about this long)


@dataclass
class RMConfig:
    listen: str = "127.0.0.1:7070"
    advertise: str = ""                 # what agents and AMs dial; defaults to listen
    state_dir: Path = field(default_factory=lambda: default_state_dir("rm"))
    queues_file: str = ""
    mqtt_url: str = ""                  # external broker; empty = run the embedded one
    mqtt_listen: str = "127.0.0.1:0"    # embedded broker address; port 0 picks a free port
    # Broker logins (brokerauth.py). A role without a username uses the state dir's broker.secret.
    mqtt_username: str = ""             # the RM's own login (role gpurm-rm: publishes)
    mqtt_password_file: str = ""
    mqtt_reader_username: str = ""      # handed to agents, AMs and the CLI (role gpurm-reader: reads only)
    mqtt_reader_password_file: str = ""
    admins: list[str] = field(default_factory=lambda: ["root"])
    settings: RMSettings = field(default_factory=RMSettings)
    view_publish_interval_s: float = 0.2    # deltas at most this often
    view_snapshot_interval_s: float = 5.0   # a retained full snapshot at most this often
    scheduler_interval_s: float = 0.02     # at most one scheduling pass per interval under load
    limits: ServerLimits = field(default_factory=ServerLimits)
    tls: TLSConfig | None = None            # mTLS for every gRPC connection; None = plaintext
    shutdown_grace_s: float = 2.0           # on SIGTERM/SIGINT: time in-flight requests get to finish
    shutdown_timeout_s: float = 10.0        # ... and the RM exits hard this long after the signal, whatever hangs
    store_backups: int = 5                  # automatic store backups kept (one written at each start)
    store_url: str = ""                     # sqlite:///PATH or postgresql://...; empty: STATE_DIR/state.db
    http: HTTPConfig = field(default_factory=HTTPConfig)
    am_rm_retry_for_s: float = AM_POLICY.give_up_s   # an AM rides out an unreachable RM this long (0: forever)
    retention: RetentionSettings = field(default_factory=RetentionSettings)   # finished jobs (rm/state/retention.py)
    ha: HAConfig = field(default_factory=HAConfig)   # several RMs on one PostgreSQL (rm/server/leadership.py)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)   # start-time forecasts (rm/forecast/)

    @property
    def advertised(self) -> str:
        if self.advertise:
            return self.advertise
        host, port = parse_address(self.listen)
        if host in ("0.0.0.0", "::", ""):
            import socket

            host = socket.getfqdn()
        return f"{host}:{port}"


def load_rm_config(path: Path | None, overrides: dict[str, Any] | None = None) -> RMConfig:
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of settings"])
    data = {**data, **(overrides or {})}
    p = Problems()
    r = Reader(data, "", p)
    cfg = RMConfig()
    cfg.listen = r.text("listen", cfg.listen)
    cfg.advertise = r.text("advertise", "")
    state_dir = r.text("state_dir", "")
    if state_dir:
        cfg.state_dir = Path(state_dir).expanduser()
    cfg.queues_file = r.text("queues", "")
    if cfg.queues_file and path is not None and not os.path.isabs(cfg.queues_file):
        cfg.queues_file = str((path.parent / cfg.queues_file).resolve())
    for key in ("listen", "advertise"):
        value = getattr(cfg, key)
        if value:
            try:
                parse_address(value)
            except ValueError as exc:
                r.error(key, str(exc))
    m = r.section("mqtt")
    cfg.mqtt_url = m.text("url", "")
    cfg.mqtt_listen = m.text("listen", cfg.mqtt_listen)
    if cfg.mqtt_url and not cfg.mqtt_url.startswith("mqtt://"):
        m.error("url", f"must look like mqtt://HOST:PORT, got {cfg.mqtt_url!r}")
    for prefix in ("", "reader_"):
        user, pw_file = m.text(f"{prefix}username", ""), m.text(f"{prefix}password_file", "")
        if bool(user) != bool(pw_file):
            given, missing = (f"{prefix}username", f"{prefix}password_file") if user else \
                (f"{prefix}password_file", f"{prefix}username")
            m.error(missing, f"required with mqtt.{given} (a login is a username and a file holding its password)")
        if pw_file and path is not None and not os.path.isabs(pw_file):
            pw_file = str((path.parent / pw_file).resolve())
        setattr(cfg, f"mqtt_{prefix}username", user)
        setattr(cfg, f"mqtt_{prefix}password_file", pw_file)
    if cfg.mqtt_username and cfg.mqtt_username == cfg.mqtt_reader_username:
        m.error("reader_username", "must differ from mqtt.username: the reader may not publish")
    m.reject_unknown()
    cfg.admins = r.strings("admins", cfg.admins)
    cfg.tls = read_tls_section(r, "tls", path.parent if path is not None else None)
    st = r.section("store")
    cfg.store_backups = st.integer("backups", cfg.store_backups, minimum=0, maximum=1000)
    raw_url = st.raw("url")
    if raw_url is not None:
        try:
            cfg.store_url = parse_store_url(raw_url).url
        except ValueError as exc:
            st.error("url", str(exc))
    st.reject_unknown()
    cfg.ha = read_ha_section(r, cfg.store_url)
    s = RMSettings()
    hb = r.section("heartbeat")
    read_heartbeat_section(hb, s, cfg.ha)
    c = r.section("containers")
    s.container_start_timeout_s = c.duration("start_timeout", s.container_start_timeout_s)
    s.kill_grace_s = c.duration("kill_grace", s.kill_grace_s)
    c.reject_unknown()
    am = r.section("am")
    s.am_max_attempts = am.integer("max_attempts", s.am_max_attempts, minimum=1)
    s.am_register_timeout_s = am.duration("register_timeout", s.am_register_timeout_s)
    s.am_liveness_timeout_s = am.duration("liveness_timeout", s.am_liveness_timeout_s)
    s.allocate_interval_s = am.duration("allocate_interval", s.allocate_interval_s)
    s.max_allocate_rate = am.number("max_allocate_rate", s.max_allocate_rate, minimum=0.1)
    s.max_active_ams = am.integer("max_active", s.max_active_ams, minimum=1)
    s.max_acquiring_per_queue = am.integer("max_acquiring_per_queue", s.max_acquiring_per_queue, minimum=1)
    cfg.am_rm_retry_for_s = am.duration("rm_retry_for", cfg.am_rm_retry_for_s)
    am.reject_unknown()
    tok = r.section("tokens")
    s.token_ttl_s = tok.duration("ttl", s.token_ttl_s, maximum=24 * 3600)
    if s.token_ttl_s < 30:
        tok.error("ttl", f"at least 30s (holders renew at a third of it), got {s.token_ttl_s:g}s")
    tok.reject_unknown()
    pre = r.section("preemption")
    s.inqueue_preemption = pre.flag("in_queue", s.inqueue_preemption)
    s.inqueue_min_run_s = pre.duration("in_queue_min_run", s.inqueue_min_run_s)
    s.las_thresholds_gpu_s = read_las_thresholds(pre, s.las_thresholds_gpu_s)
    pre.reject_unknown()
    el = r.section("elastic")
    s.elastic_idle_hold_s = el.duration("idle_hold", s.elastic_idle_hold_s)
    s.elastic_regrow_hold_s = el.duration("regrow_hold", s.elastic_regrow_hold_s, maximum=86400.0)
    el.reject_unknown()
    cfg.limits = read_limits(r)
    sch = r.section("scheduler")
    cfg.scheduler_interval_s = sch.duration("interval", cfg.scheduler_interval_s)
    s.am_launch_coalesce_s = cfg.scheduler_interval_s     # a burst of submits: one AM launch per interval
    s.reservations = sch.integer("reservations", s.reservations, minimum=0, maximum=MAX_RESERVATIONS)
    s.reserve_after_s = sch.duration("reserve_after", s.reserve_after_s)
    s.reserve_behind = sch.number("reserve_behind", s.reserve_behind, minimum=0.0, maximum=MAX_BEHIND)
    read_history_section(sch.section("history"), s, path.parent if path is not None else None)
    sch.reject_unknown()
    if s.heartbeat_interval_s <= 0:
        hb.error("interval", "must be above 0")
    sd = r.section("shutdown")
    cfg.shutdown_grace_s = sd.duration("grace", cfg.shutdown_grace_s, maximum=3600.0)
    cfg.shutdown_timeout_s = sd.duration("timeout", cfg.shutdown_timeout_s, maximum=3600.0)
    if cfg.shutdown_timeout_s <= cfg.shutdown_grace_s:
        sd.error("timeout", f"must be above grace ({cfg.shutdown_grace_s:g}s), got {cfg.shutdown_timeout_s:g}s")
    sd.reject_unknown()
    cfg.http = read_http_section(r)
    cfg.retention = read_retention_section(r)
    cfg.forecast = read_forecast_section(r)
    cfg.settings = s
    r.reject_unknown()
    p.raise_if_any()
    return cfg


def read_heartbeat_section(hb: Reader, s: RMSettings, ha: HAConfig) -> None:
    """`heartbeat`: the interval, the node expiry and the agents' lease (gpurm/common/lease.py's rules). With `ha`,
    the lease must also outlast a takeover, or every takeover stops every job; missed_beats then defaults to the
    fewest that allow it."""
    s.heartbeat_interval_s = hb.duration("interval", s.heartbeat_interval_s)
    s.resync_grace_s = hb.duration("resync_grace", s.resync_grace_s)
    s.agent_lease_s = hb.duration("lease", s.agent_lease_s)
    s.fence_grace_s = hb.duration("fence_grace", s.fence_grace_s, maximum=3600.0)
    need = takeover_lease_s(takeover_within_s(ha.lease_s), s.heartbeat_interval_s)
    if ha.enabled and hb.raw("missed_beats") is None and s.heartbeat_interval_s > 0 and s.agent_lease_s <= 0:
        s.missed_beats = max(s.missed_beats, beats_for_lease(need, s.heartbeat_interval_s, s.fence_grace_s))
    s.missed_beats = hb.integer("missed_beats", s.missed_beats, minimum=1)
    s.heartbeat_max_rate = hb.number("max_rate", s.heartbeat_max_rate, minimum=0.0, maximum=1e6)
    s.heartbeat_max_interval_s = hb.duration("max_interval", s.heartbeat_max_interval_s, maximum=MAX_BEAT_INTERVAL_S)
    if s.heartbeat_interval_s > 0:
        timing = fence_timing(s.heartbeat_interval_s, s.missed_beats, s.agent_lease_s, s.fence_grace_s)
        for key, why in timing.problems():
            hb.error(key, why)
        s.agent_lease_s = timing.lease_s
        if ha.enabled and not timing.problems() and timing.lease_s < need:
            key = "lease" if hb.raw("lease") is not None else "missed_beats"
            beats = beats_for_lease(need, s.heartbeat_interval_s, s.fence_grace_s)
            fix = (f"set lease to {need:g}s or more (and missed_beats to {beats} or more)" if key == "lease" else
                   f"set missed_beats to {beats} or more (or leave it out: with ha it defaults to that)")
            hb.error(key, f"the agents' lease ({timing.lease_s:g}s) must outlast an RM takeover (ha.lease "
                          f"{ha.lease_s:g}s): at least {need:g}s, or every takeover stops every job; {fix}, or "
                          "shorten ha.lease")
        if s.heartbeat_max_rate > 0 and s.heartbeat_max_interval_s < s.heartbeat_interval_s:
            hb.error("max_interval", f"must be at least heartbeat.interval ({s.heartbeat_interval_s:g}s), got "
                                     f"{s.heartbeat_max_interval_s:g}s (set max_rate: 0 for a fixed interval)")
        elif not timing.problems() and s.heartbeat_max_rate > 0:
            # The lease scales with the interval (rm/state/heartbeats.py): safe at every interval when safe at the
            # base one. Checked at the longest, all the same.
            top = terms_at(s, s.heartbeat_max_interval_s)
            for key, why in fence_timing(top.interval_s, s.missed_beats, top.lease_s, top.grace_s).problems():
                hb.error("max_interval", f"at {top.interval_s:g}s ({key}): {why}")
    hb.reject_unknown()


def read_history_section(h: Reader, s: RMSettings, base: Path | None) -> None:
    """`scheduler.history`: what the run-time estimates and `gittins` condition on (`group_by`), and the finished
    jobs they start from (`prior`: a CSV file, rm/sched/prior.py)."""
    s.history_conditioning = h.text("group_by", s.history_conditioning, choices=LEVELS)
    raw = h.raw("prior")
    if raw is not None:
        if not isinstance(raw, str) or not raw:
            h.error("prior", f"must be the path of a CSV file of finished jobs, got {raw!r:.40}")
        else:
            file = Path(raw) if Path(raw).is_absolute() or base is None else base / raw
            try:
                s.history_prior = load_prior(file)
            except PriorError as exc:
                h.error("prior", str(exc))
    h.reject_unknown()


def read_las_thresholds(r: Reader, default: tuple[float, ...]) -> tuple[float, ...]:
    """`las_thresholds`: GPU-time (GPUs x duration: 1h = one GPU-hour) at which a las job drops a level; rising."""
    raw = r.raw("las_thresholds")
    if raw is None:
        return default
    if not isinstance(raw, list) or not raw:
        r.error("las_thresholds", f"must be a list of GPU-times such as [1h, 10h, 100h], got {raw!r:.40}")
        return default
    out: list[float] = []
    for item in raw:
        try:
            out.append(parse_duration(item))
        except ValueError as exc:
            r.error("las_thresholds", str(exc))
            return default
    problem = las_thresholds_problem(out)
    if problem:
        r.error("las_thresholds", f"{problem}, got {raw!r:.60}")
        return default
    return tuple(out)


def read_http_section(r: Reader) -> HTTPConfig:
    """`http: {enabled, listen, max_body_bytes}`; a non-mapping, a bad address or an unknown key names the field."""
    out = HTTPConfig()
    h = r.section("http")
    out.enabled = h.flag("enabled", out.enabled)
    out.listen = h.text("listen", out.listen)
    try:
        parse_address(out.listen)
    except ValueError as exc:
        h.error("listen", str(exc))
    out.max_body_bytes = h.integer("max_body_bytes", out.max_body_bytes, minimum=1024, maximum=64 << 20)
    h.reject_unknown()
    return out


def _keep_for(r: Reader, key: str, default: float) -> float:
    """A retention: a duration, or `never` (kept for good)."""
    raw = r.raw(key)
    if isinstance(raw, str) and raw.strip().lower() in ("never", "forever"):
        return NEVER
    return r.duration(key, default)


def read_retention_section(r: Reader) -> RetentionSettings:
    """`retention: {memory: 1h, store: 30d}`: how long finished jobs stay in memory, then their detail in the
    store (rm/state/retention.py); `never` keeps them. memory at least 1m; store at least memory."""
    out = RetentionSettings()
    t = r.section("retention")
    out.memory_s = _keep_for(t, "memory", out.memory_s)
    out.store_s = _keep_for(t, "store", out.store_s)
    if out.memory_s < MIN_MEMORY_S:
        t.error("memory", f"at least {MIN_MEMORY_S:g}s (a client retrying a submit within it gets the same job), or "
                          f"never; got {out.memory_s:g}s")
        out.memory_s = MIN_MEMORY_S
    if out.store_s < out.memory_s:
        shown = "never" if out.memory_s == NEVER else f"{out.memory_s:g}s"
        t.error("store", f"must be at least retention.memory ({shown}): a job's detail leaves the store only after "
                         f"it left memory; got {out.store_s:g}s")
    out.batch = t.integer("batch", out.batch, minimum=1, maximum=1_000_000)
    t.reject_unknown()
    return out


def read_ha_section(r: Reader, store_url: str) -> HAConfig:
    h = r.section("ha")
    out = HAConfig(enabled=h.flag("enabled", False))
    if out.enabled and not store_url.startswith(("postgresql://", "postgres://")):
        h.error("enabled", "needs a PostgreSQL store (store.url: postgresql://USER@HOST:PORT/DB), which every RM of "
                           "the set shares")
    out.lease_s = h.duration("lease", out.lease_s, maximum=600.0)
    if out.lease_s < 1.0:
        h.error("lease", f"must be at least 1s (renewed every third of it), got {out.lease_s:g}s")
    h.reject_unknown()
    return out
