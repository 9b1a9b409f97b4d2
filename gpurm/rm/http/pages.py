"""The web UI: server-rendered HTML pages (no build step, nothing from outside the RM) built from the same
answers as the REST API (api.py), so a page shows a caller exactly what the API would. Every piece of text from
outside (job names, commands, users, reasons, log lines) goes through `e()` (html.escape); bars and charts are
SVG with numeric attributes, since the Content-Security-Policy allows no inline style or script. static/app.js
polls the REST API every few seconds and redraws the page when what it shows changed.
"""

from __future__ import annotations

import asyncio
import html
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from aiohttp import web

from gpurm.common import forecasttext
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.http import api
from gpurm.rm.http.auth import USER_COOKIE
from gpurm.rm.server.service import check_may_read_logs
from gpurm.rm.state.messages import ErrorCode, RequestError

if TYPE_CHECKING:
    from gpurm.rm.security.identity import Caller

STATIC = Path(__file__).resolve().parent / "static"
REFRESH_MS = 3000
MAX_LOG_TAILS = 8          # ranks whose log tail a job page shows (one agent call each per redraw)
TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def u(value: object) -> str:
    """A path segment."""
    return quote(str(value), safe="")


def when(ms: int | float | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ms) / 1000))


def span(start_ms: int, end_ms: int) -> str:
    if not start_ms:
        return "-"
    seconds = max(0, int(((end_ms or time.time() * 1000) - start_ms) / 1000))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """`rows` hold HTML already escaped by the caller."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def state_badge(state: str) -> str:
    return f'<span class="state state-{e(state.lower())}">{e(state)}</span>'


def job_link(job_id: str) -> str:
    return f'<a href="/jobs/{u(job_id)}">{e(job_id)}</a>'


def node_link(node_id: str) -> str:
    return f'<a href="/nodes/{u(node_id)}">{e(node_id)}</a>'


def layout(request: web.Request, title: str, body: str, refresh: str = "", status: int = 200) -> web.Response:
    """The page around `body`; `refresh`: the REST URL app.js polls to know when to redraw (none: static)."""
    who: Caller | None = request.get(api.CALLER)
    mtls = request.app[api.MTLS]
    ident = ""
    if who is not None:
        ident = f'<span class="who">you are {e(who.describe())}</span>'
        if not mtls:
            ident += ('<form class="viewas" method="get" action="/view-as"><label>view as '
                      f'<input name="user" value="{e(who.name)}" size="10" maxlength="64"></label>'
                      '<button type="submit">set</button></form>')
    refresh_attr = f' data-refresh="{e(refresh)}" data-every="{REFRESH_MS}"' if refresh else ""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} - gpurm</title><link rel="stylesheet" href="/static/style.css"></head>
<body><header><a class="brand" href="/">gpurm</a><nav><a href="/">overview</a><a href="/queues">queues</a>
<a href="/jobs">jobs</a><a href="/api/v1/openapi.json">API</a></nav>{ident}</header>
<main id="main"{refresh_attr}><h1>{e(title)}</h1>
{body}</main><footer><span id="updated"></span></footer><script src="/static/app.js"></script></body></html>"""
    return web.Response(text=page, content_type="text/html", status=status)


def error_page(request: web.Request, response: web.Response) -> web.Response:
    """An API-style error answered to a page: the same status and message, as HTML."""
    try:
        message = json.loads(response.text or "{}")["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.reason or "error"
    return layout(request, f"{response.status} {response.reason}", f'<p class="error">{e(message)}</p>',
                  status=response.status)


# ---------------------------------------------------------------- pieces


def gpu_cells(node: dict[str, Any], highlight: str = "") -> str:
    """A server as a row of GPU squares (free / used / shared / unhealthy / offline); `highlight`: a job whose
    GPUs are marked."""
    out = []
    for g in node["gpus"]:
        mine = bool(highlight) and highlight in g["jobs"]
        tip = f"GPU {g['index']}: {g['state']}" + (f" ({', '.join(g['jobs'])})" if g["jobs"] else "") + \
              (f" - {g['health_reason']}" if g["health_reason"] else "")
        cls = f"gpu gpu-{g['state']}" + (" gpu-mine" if mine else "")
        out.append(f'<span class="{e(cls)}" title="{e(tip)}">{e(g["index"])}</span>')
    return "".join(out)


def tally(cells: Iterable[dict[str, Any]]) -> str:
    """`5 free, 3 used, 1 unhealthy` (states with none left out; `0 free` when nothing is)."""
    counts: dict[str, int] = {}
    for g in cells:
        counts[g["state"]] = counts.get(g["state"], 0) + 1
    order = ("free", "used", "shared", "unhealthy", "offline")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k)) or "0 free"


def bar(parts: Iterable[tuple[float, str, str]], total: float, width: int = 240) -> str:
    """An SVG bar: (amount, css class, label) segments side by side, scaled to `total`."""
    x = 0.0
    rects = []
    scale = width / total if total > 0 else 0.0
    for amount, cls, label in parts:
        w = max(0.0, amount) * scale
        if w > 0:
            rects.append(f'<rect class="{e(cls)}" x="{x:.1f}" y="0" width="{w:.1f}" height="14">'
                         f"<title>{e(label)}</title></rect>")
        x += w
    return (f'<svg class="bar" width="{width}" height="14" viewBox="0 0 {width} 14" role="img">'
            f'<rect class="bar-bg" x="0" y="0" width="{width}" height="14"></rect>{"".join(rects)}</svg>')


def marker_bar(used: float, share: float, guaranteed: float, pending: float, total: float) -> str:
    width = 240
    scale = width / total if total > 0 else 0.0
    body = bar([(used, "seg-used", f"used {used:g}"), (pending, "seg-pending", f"pending {pending:g}")],
               total, width)
    marks = ""
    for value, cls, label in ((share, "mark-share", f"fair share {share:g}"),
                              (guaranteed, "mark-min", f"guaranteed {guaranteed:g}")):
        if value > 0:
            x = min(width - 1.0, value * scale)
            marks += (f'<line class="{cls}" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="14"><title>{e(label)}</title>'
                      "</line>")
    return body.replace("</svg>", marks + "</svg>")


def chart(series: dict[str, list[dict[str, Any]]], width: int = 640, height: int = 160) -> str:
    """GPU utilisation over time as SVG polylines, one per GPU of each series."""
    lines = []
    points_all = [p["time_ms"] for points in series.values() for p in points]
    if not points_all:
        return ""
    t0, t1 = min(points_all), max(points_all)
    span_ms = max(t1 - t0, 1)
    n = 0
    legend = []
    for name, points in series.items():
        gpus = sorted({g for p in points for g in p["util_pct"]}, key=int)
        for gpu in gpus:
            xy = " ".join(f"{(p['time_ms'] - t0) / span_ms * (width - 40) + 35:.1f},"
                          f"{height - 15 - p['util_pct'][gpu] / 100 * (height - 25):.1f}"
                          for p in points if gpu in p["util_pct"])
            lines.append(f'<polyline class="line line-{n % 8}" points="{xy}"><title>{e(name)} GPU {e(gpu)}'
                         "</title></polyline>")
            legend.append(f'<span class="legend line-{n % 8}">{e(name)} GPU {e(gpu)}</span>')
            n += 1
    axes = (f'<line class="axis" x1="35" y1="10" x2="35" y2="{height - 15}"></line>'
            f'<line class="axis" x1="35" y1="{height - 15}" x2="{width - 5}" y2="{height - 15}"></line>'
            f'<text x="2" y="14">100%</text><text x="10" y="{height - 15}">0%</text>'
            f'<text x="35" y="{height - 2}">{e(when(t0))}</text>'
            f'<text x="{width - 130}" y="{height - 2}">{e(when(t1))}</text>')
    return (f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
            f'{axes}{"".join(lines)}</svg><div class="legends">{"".join(legend)}</div>')


# ---------------------------------------------------------------- pages


def server_rows(nodes: Iterable[dict[str, Any]]) -> str:
    return "".join(f'<div class="server"><span class="server-name">{node_link(n["node_id"])}'
                   f' <small>{e(n["state"])}</small></span><span class="gpus">{gpu_cells(n)}</span>'
                   f'<small class="tally">{e(tally(n["gpus"]))}</small></div>' for n in nodes)


def rack_tally(gpus: dict[str, int]) -> str:
    return ", ".join(f"{gpus[k]} {k}" for k in api.GPU_STATES if gpus.get(k)) or "0 free"


def rack_table(racks: list[dict[str, Any]]) -> str:
    """A fleet's racks, one row each: its servers, its GPUs by state as a bar and in numbers, a link to draw
    its servers (the drill-down)."""
    top = max((r["gpus"]["total"] for r in racks), default=1) or 1
    rows = [[f'<a href="/?{e(urlencode({"rack": r["rack"]}))}">{e(r["rack"])}</a>', e(r["servers"]),
             *(e(r["gpus"][k]) for k in api.GPU_STATES),
             bar([(r["gpus"][k], f"gpu-{k}", f"{r['gpus'][k]} {k}") for k in api.GPU_STATES], top, 160)]
            for r in racks]
    return table(["rack", "servers", *api.GPU_STATES, "GPUs"], rows, "racks filterable")


async def overview(request: web.Request) -> web.Response:
    """The cluster: every server's GPUs on a small cluster; on a fleet, one row per rack (the find box filters
    them) and a rack's servers on `?rack=NAME`. The page polls the same summary it shows (small on a fleet)."""
    rack = request.query.get("rack", "")
    summary = api.cluster_summary(api.shell_of(request), api.caller(request), rack)
    g = summary["gpus"]
    rm = summary["rm"]
    counts = "".join(f'<div class="count count-{e(k)}"><b>{e(v)}</b> {e(k)}</div>'
                     for k, v in g.items())
    jobs = "".join(f'<a class="count" href="/jobs?{urlencode({"state": k})}"><b>{e(v)}</b> {e(k.lower())}</a>'
                   for k, v in summary["jobs"].items())
    shown = [r for r in summary["racks"] if r["detailed"] and (not rack or r["rack"] == rack)]
    sections = "".join(f'<section class="rack"><h3>{e(r["rack"])} <small class="tally">{e(rack_tally(r["gpus"]))}'
                       f'</small></h3>{server_rows(r["nodes"])}</section>' for r in shown)
    if rack:
        racks = f'<p class="crumbs"><a href="/">all racks</a> / {e(rack)}</p>{sections}'
    elif shown or not summary["racks"]:
        racks = sections or "<p>no nodes have registered yet</p>"
    else:
        servers = sum(r["servers"] for r in summary["racks"])
        racks = (f'<p class="meta">{e(servers)} servers in {e(len(summary["racks"]))} racks: a rack\'s name draws '
                 f'its servers</p><p><label>find <input id="find" type="search" placeholder="a rack\'s name">'
                 f'</label></p>{rack_table(summary["racks"])}')
    warn = "".join(f'<p class="warning">{e(w)}</p>' for w in rm.get("warnings", []))
    if rm.get("store_error"):
        warn += f'<p class="error">store: {e(rm["store_error"])}</p>'
    body = (f'{warn}<p class="meta">RM {e(rm["version"])}, epoch {e(rm["epoch"])}, up since '
            f'{e(when(rm["started_ms"]))}; {e("insecure mode" if rm["insecure"] else "mTLS")}</p>'
            f'<h2>GPUs</h2><div class="counts" id="gpu-counts">{counts}</div>'
            f'<div class="key"><span class="gpu gpu-free"></span>free <span class="gpu gpu-used"></span>used '
            f'<span class="gpu gpu-shared"></span>shared <span class="gpu gpu-unhealthy"></span>unhealthy '
            f'<span class="gpu gpu-offline"></span>offline</div>'
            f'<div class="racks" id="racks">{racks}</div>'
            f'<h2>Jobs</h2><div class="counts" id="job-counts">{jobs}</div>')
    refresh = f"{api.PREFIX}/cluster" + (f"?{urlencode({'rack': rack})}" if rack else "")
    return layout(request, "Cluster overview" + (f": {rack}" if rack else ""), body, refresh=refresh)


async def queues(request: web.Request) -> web.Response:
    data = api.queue_list(api.shell_of(request))
    cap = float(data["capacity"]) or 1.0
    rows = []
    for q in data["queues"]:
        depth = q["path"].count(".")
        name = f'<span class="indent-{min(depth, 6)}">{e(q["path"].rsplit(".", 1)[-1])}</span>'
        rows.append([
            name, e(f"{q['weight']:g}"), e(q["min_gpus"]), e(q["instantaneous_share"]), e(f"{q['used']:g}"),
            e(f"{q['pending']:g}"), e(q["running_jobs"]), e(q["queued_jobs"]),
            marker_bar(q["used"], q["instantaneous_share"], q["min_gpus"], q["pending"], cap),
            e(q["policy"] or "-")])
    body = (f'<p class="meta">capacity {e(data["capacity"])} GPUs. Bar: used (solid), pending (light), '
            f'fair share (dark mark), guaranteed (red mark).</p>'
            + table(["queue", "weight", "guaranteed", "share", "used", "pending", "running", "queued", "", "policy"],
                    rows, "queues"))
    return layout(request, "Queues", body, refresh=f"{api.PREFIX}/queues")


async def jobs(request: web.Request) -> web.Response:
    shell, who = api.shell_of(request), api.caller(request)
    q = request.query
    limit = api.int_param(request, "limit", 50, 1, api.MAX_LIMIT)
    data = api.job_list(shell, who, api.states_param(request), q.get("queue", "")[:256], q.get("user", "")[:64],
                        limit, page_token=q.get("page_token", ""))
    rows = []
    for j in data["jobs"]:
        spec = j["spec"]
        gpus = f"{spec['gpu_share_milli'] / 1000:g}" if spec["gpu_share_milli"] else str(spec["gpus"])
        rows.append([job_link(j["job_id"]), e(spec["name"]), e(j["user"]), e(j["queue"].removeprefix("root.")),
                     state_badge(j["state"]), e(gpus), e(span(j["submit_ms"], j["finish_ms"])),
                     e(_forecast(j, brief=True)), e(j["waiting_reason"] or j["diagnostics"])])
    state_now = ",".join(q.getall("state", []))
    options = "".join(f'<option value="{s}"{" selected" if s == state_now else ""}>{s.lower() or "any"}</option>'
                      for s in ["", *api.STATES])
    form = (f'<form class="filters" method="get" action="/jobs">'
            f'<label>user <input name="user" value="{e(q.get("user", ""))}" maxlength="64"></label>'
            f'<label>queue <input name="queue" value="{e(q.get("queue", ""))}" maxlength="256"></label>'
            f'<label>state <select name="state">{options}</select></label><button type="submit">filter</button>'
            f'<label>find <input id="find" type="search" placeholder="any text in the table"></label></form>')
    more = ""
    if data["next_page_token"]:
        args = {k: v for k, v in q.items() if k != "page_token"}
        older = urlencode({**args, "page_token": data["next_page_token"]})
        more = f'<p><a id="older" href="/jobs?{e(older)}">older jobs</a></p>'
    api_query = urlencode([(k, v) for k, v in q.items() if k in ("user", "queue", "state", "page_token")]
                          + [("limit", str(limit))])
    matching = "jobs match" if data["total"] is None else f'{e(data["total"])} jobs match'
    body = (form + f'<p class="meta">{matching}, newest first, {e(limit)} a page</p>'
            + table(["job", "name", "user", "queue", "state", "GPUs", "time", "start", "waiting / ended"], rows,
                    "jobs filterable") + more)
    return layout(request, "Jobs", body, refresh=f"{api.PREFIX}/jobs?{api_query}")


def _placement(summary: dict[str, Any], job: dict[str, Any]) -> str:
    attempts = job["attempts"]
    if not attempts:
        return "<p>not placed yet</p>"
    nodes = {lr["node_id"] for lr in attempts[-1]["learners"] if lr["node_id"]}
    if not nodes:
        return "<p>not placed yet</p>"
    rows = []
    for rack in summary["racks"]:
        for n in rack["nodes"]:
            if n["node_id"] in nodes:
                rows.append(f'<div class="server"><span class="server-name">{node_link(n["node_id"])} '
                            f'<small>{e(rack["rack"])}</small></span>'
                            f'<span class="gpus">{gpu_cells(n, job["job_id"])}</span></div>')
    if job["state"] in TERMINAL:
        return ("<p>ended; where its last attempt ran:</p>"
                + table(["rank", "node", "GPUs"], [[e(lr["rank"]), node_link(lr["node_id"]),
                                                    e(",".join(map(str, lr["gpu_indices"])))]
                                                   for lr in attempts[-1]["learners"]]))
    return ('<div class="placement">' + "".join(rows) + '</div><p class="meta">its GPUs are outlined</p>')


async def _log_tails(request: web.Request, job: dict[str, Any]) -> str:
    shell, who = api.shell_of(request), api.caller(request)
    if not job["may_see_private"]:
        try:
            check_may_read_logs(shell, who, shell.find_job(job["job_id"]))
        except RequestError as exc:
            return f'<p class="denied">{e(exc.message)}</p>'
    attempts = job["attempts"]
    if not attempts or not attempts[-1]["learners"]:
        return "<p>no logs yet: the job has not started</p>"
    learners = [lr for lr in attempts[-1]["learners"] if lr["container_id"]]
    shown = learners[:MAX_LOG_TAILS]

    async def tail(rank: int) -> str:
        try:
            reply = await shell.read_logs(pb.GetLogsRequest(job_id=job["job_id"], rank=rank), tail=api.TAIL_BYTES)
        except RequestError as exc:
            return f"(cannot read it: {exc.message})"
        return reply.data.decode(errors="replace") or "(empty so far)"

    texts = await asyncio.gather(*(tail(lr["rank"]) for lr in shown))      # one agent call per rank, at once
    out = [f'<h3>rank {e(lr["rank"])} on {e(lr["node_id"])}</h3><pre class="log" id="log-{e(lr["rank"])}">'
           f"{e(text)}</pre>" for lr, text in zip(shown, texts, strict=True)]
    if len(learners) > len(shown):
        out.append(f'<p class="meta">{len(learners) - len(shown)} more ranks: '
                   f'<code>{e(api.PREFIX)}/jobs/{e(u(job["job_id"]))}/logs?rank=N&amp;tail=8192</code> or '
                   f'<code>gpurm logs {e(job["job_id"])} --rank N</code></p>')
    return "".join(out) or "<p>no learner has started yet</p>"


def _forecast(job: dict[str, Any], brief: bool = False) -> str:
    """A waiting job's forecast start in words (gpurm/common/forecasttext.py); "-" when it has none."""
    f = job.get("forecast") or {}
    if not f.get("made_ms") or job["state"] not in ("QUEUED", "ALLOCATING"):
        return "-"
    words = forecasttext.short if brief else forecasttext.sentence
    return words(f["earliest_ms"], f["likely_ms"], f["latest_ms"], f["horizon_ms"], f["made_ms"], time.time())


async def job_page(request: web.Request) -> web.Response:
    shell, who = api.shell_of(request), api.caller(request)
    job_id = request.match_info["job_id"]
    job = api.job_detail(shell, who, job_id)
    spec = job["spec"]
    placed = job["attempts"][-1]["learners"] if job["attempts"] else []
    summary = api.cluster_summary(shell, who, nodes=frozenset(lr["node_id"] for lr in placed if lr["node_id"]))
    command = " ".join(spec["command"])
    env = "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in spec["env"].items())
    facts = [
        ("state", state_badge(job["state"])), ("name", e(spec["name"])), ("user", e(job["user"])),
        ("queue", e(job["queue"])), ("GPUs", e(f"{spec['gpu_share_milli'] / 1000:g}" if spec["gpu_share_milli"]
                                               else spec["gpus"])),
        ("GPUs held", e(job["gpus_held"])), ("command", f"<code>{e(command)}</code>"),
        ("workdir", e(spec["workdir"] or "-")), ("submitted", e(when(job["submit_ms"]))),
        ("started", e(when(job["start_ms"]))), ("finished", e(when(job["finish_ms"]))),
        ("why it waits", e(job["waiting_reason"] or "-")), ("expected start", e(_forecast(job))),
        ("diagnostics", e(job["diagnostics"] or "-")),
        ("exit code", e(job["exit_code"])), ("preemptions", e(job["preemptions"])),
        ("failures", e(job["failures"]))]
    dl = "".join(f'<dt>{e(k)}</dt><dd id="fact-{e(k.replace(" ", "-"))}">{v}</dd>' for k, v in facts)
    attempts = table(["attempt", "state", "level", "started", "ended", "cause"],
                     [[e(a["attempt"]), state_badge(a["state"]), e(a["level"] or "-"), e(when(a["start_ms"])),
                       e(when(a["end_ms"])), e(a["cause"] or "-")] for a in job["attempts"]], "attempts")
    util = api.job_utilisation(shell, job_id)
    kill = ""
    if job["may_kill"] and job["state"] not in TERMINAL:
        kill = f'<button id="kill" class="danger" data-job="{e(job_id)}">kill</button>'
    body = (f'{kill}<dl class="facts">{dl}</dl>'
            + (f'<h2>Environment</h2><table class="env">{env}</table>' if env else "")
            + f'<h2>Attempts</h2>{attempts}<h2>Placement</h2>{_placement(summary, job)}'
            + f'<h2>GPU utilisation</h2>{chart(util["series"]) or "<p>" + e(util["note"]) + "</p>"}'
            + f'<h2>Logs (last {api.TAIL_BYTES // 1024} KiB of each rank)</h2>{await _log_tails(request, job)}')
    refresh = f"{api.PREFIX}/jobs/{u(job_id)}" if job["state"] not in TERMINAL else ""
    return layout(request, f"Job {job_id}", body, refresh=refresh)


async def node_page(request: web.Request) -> web.Response:
    shell = api.shell_of(request)
    node = api.node_detail(shell, request.match_info["node_id"])
    telemetry = {g.get("index"): g for g in node["telemetry"].get("gpus", []) if isinstance(g, dict)}
    holders = {a["gpu_index"]: a["job_id"] for a in node["assignments"]}

    def reading(index: int, key: str, unit: str) -> str:
        value = telemetry.get(index, {}).get(key)
        return "-" if value is None else f"{value}{unit}"

    rows = [[e(g["index"]), e(g["model"]), e(f"{g['memory_mib']} MiB"),
             e("healthy" if g["healthy"] else f"UNHEALTHY: {g['health_reason']}"),
             job_link(holders[g["index"]]) if g["index"] in holders else "-",
             e(reading(g["index"], "util_pct", "%")), e(reading(g["index"], "memory_used_mib", " MiB")),
             e(reading(g["index"], "temperature_c", " C")), e(reading(g["index"], "power_w", " W"))]
            for g in node["gpus"]]
    series = {"GPU": node["utilisation"]} if node["utilisation"] else {}
    facts = [("state", e(node["state"])), ("rack", e(node["rack"])), ("IB domain", e(node["ib_domain"])),
             ("agent", e(f"{node['host']}:{node['agent_port']} (version {node['agent_version']})")),
             ("GPUs free", e(f"{node['gpus_free']}/{node['gpus_total']}")), ("CPUs", e(node["cpus"])),
             ("memory", e(f"{node['memory_mib']} MiB")), ("last heartbeat", e(when(node["last_heartbeat_ms"]))),
             ("health", e(node["health_report"] or "ok"))]
    dl = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in facts)
    body = (f'<dl class="facts">{dl}</dl><h2>GPUs</h2>'
            + table(["GPU", "model", "memory", "health", "job", "util", "mem used", "temp", "power"], rows, "gputable")
            + "<h2>GPU utilisation</h2>"
            + (chart(series) or "<p>no GPU telemetry from this node in the RM yet (agents send it every "
                                "telemetry.interval; the RM keeps the last 15 minutes in memory)</p>"))
    return layout(request, f"Node {node['node_id']}", body, refresh=f"{api.PREFIX}/nodes/{u(node['node_id'])}")


async def view_as(request: web.Request) -> web.Response:
    """Insecure mode only: remember the claimed user in a cookie (what X-Gpurm-User claims for the API)."""
    if request.app[api.MTLS]:
        raise RequestError(ErrorCode.FAILED_PRECONDITION, "with mTLS you are your certificate's name")
    user = request.query.get("user", "").strip()[:64]
    response = web.HTTPSeeOther("/")
    if user:
        response.set_cookie(USER_COOKIE, user, httponly=True, samesite="Strict", path="/")
    else:
        response.del_cookie(USER_COOKIE, path="/")
    raise response


def register(app: web.Application) -> None:
    app.router.add_get("/", overview)
    app.router.add_get("/queues", queues)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/jobs/{job_id}", job_page)
    app.router.add_get("/nodes/{node_id}", node_page)
    app.router.add_get("/view-as", view_as)
    app.router.add_static("/static", STATIC, follow_symlinks=False)
