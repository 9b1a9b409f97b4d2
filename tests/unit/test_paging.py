"""List pages (rm/server/paging.py): page tokens, page sizes, and key-set paging of jobs and nodes over the core's
dicts, with no sockets."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpurm.cli.output import JsonArray, StreamTable, print_json
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Job, JobState
from gpurm.rm.server import paging, pbviews
from gpurm.rm.state import views
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.messages import ErrorCode, RequestError
from tests.unit.test_rm_core import cluster, reg


def job(n: int, user: str = "u", queue: str = "root.a", state: JobState = JobState.QUEUED) -> Job:
    return Job(f"job-{n}", JobSpec(gpus=1, command=["x"]), user, queue, 0.0, seq=n, state=state)


def jobs_of(n: int) -> dict[str, Job]:
    return {f"job-{i}": job(i, user="alice" if i % 3 == 0 else "bob", queue="root.a" if i % 2 else "root.b",
                            state=JobState.RUNNING if i % 5 == 0 else JobState.QUEUED) for i in range(1, n + 1)}


def all_pages(index: paging.JobIndex, jobs: dict[str, Job], size: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    after: int | None = None
    while True:
        page, last = paging.job_page(index, jobs, size=size, after=after, **filters)  # type: ignore[arg-type]
        pages.append([j.job_id for j in page])
        if last is None:
            return pages
        after = last


# ---------------------------------------------------------------- tokens and sizes


def test_a_token_round_trips_and_is_opaque() -> None:
    token = paging.encode_token(paging.NODES, "gpu-0042")
    assert "gpu-0042" not in token and "=" not in token
    assert paging.decode_token(paging.NODES, token) == "gpu-0042"
    assert paging.decode_seq(paging.JOBS_UP, paging.encode_token(paging.JOBS_UP, 123)) == 123
    odd = paging.encode_token(paging.NODES, "rack:1/node ä")
    assert paging.decode_token(paging.NODES, odd) == "rack:1/node ä"


@pytest.mark.parametrize("token", ["", "%%%", "not base64!", paging.encode_token(paging.NODES, "n1"),
                                   paging.encode_token(paging.JOBS_UP, "x12"), paging.encode_token(paging.JOBS_UP, ""),
                                   paging.encode_token(paging.JOBS_UP, "-3"), "A" * 3000, "gA"])
def test_a_malformed_or_foreign_token_is_refused_naming_the_field(token: str) -> None:
    with pytest.raises(RequestError) as e:
        paging.decode_seq(paging.JOBS_UP, token)
    assert e.value.code is ErrorCode.INVALID_ARGUMENT and str(e.value).startswith("page_token: ")


@pytest.mark.parametrize("kind", sorted(paging.TOKEN_PATTERNS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_token_of_the_stated_form_is_a_position_and_every_other_is_refused(kind: str, data: st.DataObject
                                                                                ) -> None:
    """The REST document states TOKEN_PATTERNS as what the RM takes: it must be exactly that."""
    token = data.draw(st.from_regex(paging.TOKEN_PATTERNS[kind], fullmatch=True))
    key = paging.decode_token(kind, token)
    assert isinstance(key, str) and key
    other = data.draw(st.text(max_size=40))
    if not re.fullmatch(paging.TOKEN_PATTERNS[kind], other):
        with pytest.raises(RequestError):
            paging.decode_token(kind, other)
    with pytest.raises(RequestError):             # upper-case hex (every kind's prefix has a letter) is not
        paging.decode_token(kind, token.upper())


def test_page_sizes_default_and_cap() -> None:
    assert paging.page_size(0, paging.DEFAULT_NODES) == 500
    assert paging.page_size(7, 500) == 7
    assert paging.page_size(10**9, 500) == paging.MAX_PAGE
    with pytest.raises(RequestError, match="page_size: must be 0"):
        paging.page_size(-1, 500)


# ---------------------------------------------------------------- jobs


def test_25_jobs_in_pages_of_10_are_three_pages_none_missing_none_twice() -> None:
    jobs = jobs_of(25)
    pages = all_pages(paging.JobIndex(), jobs, 10)
    assert [len(p) for p in pages] == [10, 10, 5]
    flat = [j for p in pages for j in p]
    assert flat == [f"job-{i}" for i in range(1, 26)]            # oldest first, as `gpurm jobs` prints


def test_newest_first_pages_for_the_rest_api() -> None:
    jobs = jobs_of(25)
    pages = all_pages_down(paging.JobIndex(), jobs, 10)
    assert [j for p in pages for j in p] == [f"job-{i}" for i in range(25, 0, -1)]


def all_pages_down(index: paging.JobIndex, jobs: dict[str, Job], size: int) -> list[list[str]]:
    pages, after = [], None
    while True:
        page, last = paging.job_page(index, jobs, size=size, after=after, descending=True)
        pages.append([j.job_id for j in page])
        if last is None:
            return pages
        after = last


def test_pages_are_stable_when_jobs_are_submitted_between_them() -> None:
    jobs = jobs_of(25)
    index = paging.JobIndex()
    first, last = paging.job_page(index, jobs, size=10)
    for i in (26, 27):
        jobs[f"job-{i}"] = job(i)                  # submitted after the first page: they come at the end
    seen = [j.job_id for j in first]
    while last is not None:
        page, last = paging.job_page(index, jobs, size=10, after=last)
        seen += [j.job_id for j in page]
    assert seen == [f"job-{i}" for i in range(1, 28)]
    # Newest first: the new jobs are newer than the cursor, so they do not show up (nor shift the page).
    down, before = paging.job_page(index, jobs, size=5, descending=True)
    jobs["job-28"] = job(28)
    more, _ = paging.job_page(index, jobs, size=5, after=before, descending=True)
    assert [j.seq for j in down] == [27, 26, 25, 24, 23] and [j.seq for j in more] == [22, 21, 20, 19, 18]


@pytest.mark.parametrize("filters", [
    {"user": "alice"}, {"queue": "a"}, {"queue": "root.b"}, {"states": [JobState.RUNNING]},
    {"user": "bob", "queue": "b", "states": [JobState.QUEUED]}, {"user": "nobody"}, {"queue": "zzz"},
])
def test_filtered_pages_hold_exactly_the_matching_jobs(filters: dict[str, object]) -> None:
    jobs = jobs_of(40)
    match = paging.job_filter(filters.get("states", ()), str(filters.get("queue", "")),  # type: ignore[arg-type]
                              str(filters.get("user", "")))
    want = [j.job_id for j in jobs.values() if match(j)]
    for size in (1, 3, 10, 100):
        pages = all_pages(paging.JobIndex(), jobs, size, **filters)
        assert [j for p in pages for j in p] == want
        assert all(len(p) <= size for p in pages)
    assert views.list_jobs(jobs, **filters) == [jobs[j] for j in want]  # type: ignore[arg-type]


def test_newest_n_starts_the_page_at_the_newest_n_matching() -> None:
    jobs = jobs_of(30)
    page, last = paging.job_page(paging.JobIndex(), jobs, user="alice", size=100, newest=4)
    assert [j.seq for j in page] == [21, 24, 27, 30] and last is None
    assert [j.seq for j in views.list_jobs(jobs, user="alice", limit=4)] == [21, 24, 27, 30]
    page, last = paging.job_page(paging.JobIndex(), jobs, size=2, newest=5)
    assert [j.seq for j in page] == [26, 27] and last == 27


def test_a_user_filtered_page_scans_only_that_users_jobs() -> None:
    jobs = {f"job-{i}": job(i, user="bulk") for i in range(1, 5001)}
    jobs["job-5001"] = job(5001, user="rare")
    index = paging.JobIndex()
    index.sync(jobs)
    part = index.part("", "rare")
    assert part is not None and len(part) == 1
    assert index.count("", "rare") == 1 and index.count("a", "") == 5001 and index.count("", "") == 5001
    assert index.count("a", "rare") is None and index.part("", "ghost") is None and index.count("", "ghost") == 0


def test_unfinished_states_scan_only_the_unfinished_jobs_even_as_jobs_end() -> None:
    jobs = {f"job-{i}": job(i, state=JobState.SUCCEEDED) for i in range(1, 1001)}
    for i in (5, 500, 999):
        jobs[f"job-{i}"].state = JobState.RUNNING
    index = paging.JobIndex()
    page, last = paging.job_page(index, jobs, [JobState.RUNNING, JobState.QUEUED], size=2)
    assert [j.seq for j in page] == [5, 500] and last == 500 and len(index.live) == 3
    jobs["job-500"].state = JobState.KILLED             # ends between two pages
    jobs["job-1001"] = job(1001, state=JobState.QUEUED)
    page, last = paging.job_page(index, jobs, [JobState.RUNNING, JobState.QUEUED], size=2, after=last)
    assert [j.seq for j in page] == [999, 1001] and last is None
    page, _ = paging.job_page(index, jobs, [JobState.RUNNING], size=10, newest=1)
    assert [j.seq for j in page] == [999]
    for i in range(1002, 1200):                          # many jobs that end: dropped from `live` as scans skip them
        jobs[f"job-{i}"] = job(i)
    paging.job_page(index, jobs, [JobState.QUEUED], size=10)
    for i in range(1002, 1200):
        jobs[f"job-{i}"].state = JobState.FAILED
    page, _ = paging.job_page(index, jobs, [JobState.QUEUED, JobState.RUNNING], size=10)
    assert [j.seq for j in page] == [5, 999, 1001] and len(index.live) == 3
    ended, _ = paging.job_page(index, jobs, [JobState.KILLED], size=10)       # an ended state: every job
    assert [j.seq for j in ended] == [500]


def test_the_index_follows_the_dict_and_starts_over_for_a_new_one() -> None:
    jobs = jobs_of(5)
    index = paging.JobIndex()
    paging.job_page(index, jobs, size=10)
    jobs["job-6"] = job(6, user="carol")
    page, _ = paging.job_page(index, jobs, size=10, user="carol")
    assert [j.job_id for j in page] == ["job-6"]
    rebuilt = {k: jobs[k] for k in ("job-6", "job-2")}      # a core rebuilt from the store: another dict
    page, _ = paging.job_page(index, rebuilt, size=10)
    assert [j.job_id for j in page] == ["job-2", "job-6"]


def test_the_index_notices_a_dict_that_lost_keys_even_when_it_also_grew() -> None:
    jobs = jobs_of(6)
    index = paging.JobIndex()
    paging.job_page(index, jobs, size=100)
    del jobs["job-2"]
    jobs["job-7"] = job(7, user="dave")                  # as many jobs as before: only the tail tells
    page, _ = paging.job_page(index, jobs, size=100)
    assert [j.seq for j in page] == [1, 3, 4, 5, 6, 7]
    del jobs["job-3"]
    jobs["job-8"], jobs["job-9"] = job(8, user="dave"), job(9)
    page, _ = paging.job_page(index, jobs, size=100)
    assert [j.seq for j in page] == [1, 4, 5, 6, 7, 8, 9]
    page, _ = paging.job_page(index, jobs, size=100, user="dave")
    assert [j.seq for j in page] == [7, 8]


# ---------------------------------------------------------------- nodes


def test_nodes_page_by_id_and_stay_stable_when_nodes_register_between_pages() -> None:
    core = cluster(0)
    for i in (5, 1, 9, 3, 7):
        core.register_node(reg(f"n{i}"), f"s{i}", now=0.0)
    index = paging.NodeIndex()
    page, last = index.page(core.cluster.nodes, 2, None)
    assert [n.node_id for n in page] == ["n1", "n3"] and last == "n3"
    core.register_node(reg("n0"), "s0", now=1.0)      # sorts before the cursor: not on a later page
    core.register_node(reg("n4"), "s4", now=1.0)      # sorts after it: on a later page
    seen = [n.node_id for n in page]
    while last is not None:
        page, last = index.page(core.cluster.nodes, 2, last)
        seen += [n.node_id for n in page]
    assert seen == ["n1", "n3", "n4", "n5", "n7", "n9"]
    everything, last = index.page(core.cluster.nodes, 100, None)
    assert [n.node_id for n in everything] == sorted(core.cluster.nodes) and last is None


# ---------------------------------------------------------------- the views a page is made of


def test_a_job_list_view_matches_one_job_views_and_computes_shared_state_once() -> None:
    core = cluster(2)
    ids = [core.submit(JobSpec(gpus=2, command=["x"]), "alice" if i % 2 else "bob", float(i)).job_id
           for i in range(6)]
    records = [core.jobs[i] for i in ids]
    listed = pbviews.job_list(core, records, {}, lambda j: j.user == "alice")
    for msg, record in zip(listed, records, strict=True):
        one = pbviews.job(core, record, {}, full=False, private=record.user == "alice")
        assert msg == one
        assert msg.waiting_reason == core.why_waiting(record)


def test_queue_stats_from_the_unfinished_jobs_match_a_walk_of_every_job() -> None:
    core = cluster(1, gpus=4)
    for i in range(8):
        core.submit(JobSpec(gpus=2, command=["x"]), "alice", float(i))
    core.kill("job-3", "alice", "", 9.0)
    assert core.queue_stats() == views.queue_stats_of(views.unfinished(core.jobs, core.ams), core.queues.tree)
    assert sum(views.queue_stats_of(views.unfinished(core.jobs, core.ams), core.queues.tree)["root"]) == 7


def test_how_many_wait_ahead_is_counted_by_bisection_as_by_a_walk() -> None:
    core = cluster(0)
    ams = AMLauncher(core.cluster, core.queues, {}, {}, 10, 10, lambda j, n, now: None)
    waiting = [job(i) for i in (3, 5, 8, 9, 12, 14)]
    for j in waiting:
        j.admitted = j.seq in (8, 14)                 # restarts: they sort first
        ams.want(j)
    for j in [*waiting, job(1), job(10), job(20), job(4, queue="root.b")]:
        walked = sum(1 for k in ams.needs_am.get(j.queue, ()) if k[1] < j.seq)
        assert ams.ahead(j) == walked
    assert ams.ahead(job(10)) == 4 and ams.ahead(job(4, queue="root.b")) == 0


def test_queue_pages_walk_the_tree_in_order() -> None:
    core = cluster(1)
    whole = pbviews.queues(core)
    paths = [q.path for q in whole.queues]
    assert whole.next_page_token == "" and whole.total == len(paths)
    first = pbviews.queues(core, 1)
    assert [q.path for q in first.queues] == paths[:1]
    if len(paths) > 1:
        rest = pbviews.queues(core, 100, paging.decode_token(paging.QUEUES, first.next_page_token))
        assert [q.path for q in rest.queues] == paths[1:] and rest.next_page_token == ""
    with pytest.raises(RequestError, match="page_token: queue nope"):
        pbviews.queues(core, 1, "nope")


# ---------------------------------------------------------------- the CLI's streaming output


def test_pages_of_json_text_written_by_the_rm_make_the_same_array_on_text_and_binary_outputs() -> None:
    items = [{"a": 1, "s": "x,\n  y"}, {"a": 2}, {"a": 3}, {"a": 4}]
    out = io.StringIO()
    with JsonArray(out) as arr:
        arr.extend(items)

    def text(part: list[dict[str, object]]) -> bytes:
        return ",\n  ".join(json.dumps(i) for i in part).encode()

    for make in (io.StringIO, lambda: io.TextIOWrapper(io.BytesIO(), encoding="utf-8")):
        sink = make()
        with JsonArray(sink) as arr:
            arr.add(items[0])                                  # an item written here, then pages from the RM
            arr.extend_text(text(items[1:3]), 2)
            arr.extend_text(b"", 0)
            arr.extend_text(text(items[3:]) + b",\n  " + text([{"a": 5}]), 2, most=1)   # cut by --limit
        assert arr.count == 4
        if isinstance(sink, io.TextIOWrapper):
            sink.flush()
            written = sink.buffer.getvalue().decode()    # type: ignore[attr-defined]
        else:
            written = sink.getvalue()
        assert written == out.getvalue()


def test_a_streamed_json_array_is_the_text_print_json_writes() -> None:
    items = [{"a": 1, "b": [1, 2]}, {"a": 2, "b": []}, {"c": "x"}]
    for n in (0, 1, 3):
        out = io.StringIO()
        with JsonArray(out) as arr:
            for item in items[:n]:
                arr.add(item)
        assert json.loads(out.getvalue()) == items[:n]
        pages = io.StringIO()                   # whole pages at a time (gpurm nodes / jobs): the same text
        with JsonArray(pages) as arr:
            arr.extend(items[:1][:n])
            arr.extend([])
            arr.extend(items[1:n])
        assert pages.getvalue() == out.getvalue()
        whole = io.StringIO()
        import sys
        saved, sys.stdout = sys.stdout, whole
        try:
            print_json(items[:n])
        finally:
            sys.stdout = saved
        assert out.getvalue() == whole.getvalue()


def test_a_streamed_table_stays_aligned_and_repeats_the_header_when_a_page_is_wider() -> None:
    out = io.StringIO()
    t = StreamTable(["ID", "STATE", "NOTE"], out)
    t.add([])                                   # an empty (filtered) page prints nothing
    assert out.getvalue() == ""
    t.add([["n1", "RUNNING", "ok"], ["n2", "DOWN", "gone away"]])
    t.add([])
    t.add([["n3", "RUNNING", "a much longer note than before"]])
    t.add([["node-with-a-long-id", "UP", ""]])
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("ID  STATE") and lines[3].startswith("n3  RUNNING  a much")
    assert lines[4] == "" and lines[5].startswith("ID                   STATE")
    assert lines[6].index("UP") == lines[5].index("STATE")
    assert [ln.index("STATE") if ln.startswith("ID") else None for ln in lines[:1]] == [4]
    assert all(ln.index(s) == 4 for ln, s in zip(lines[1:4], ("RUNNING", "DOWN", "RUNNING"), strict=True))
