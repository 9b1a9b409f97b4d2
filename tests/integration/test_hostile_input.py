"""Hostile input against one real RM: random job specs, queue configs, malformed RPC fields and raw bytes that
are not protobuf at all. Every bad request is answered with an error that names the field, changes nothing, and
the RM keeps serving (hypothesis drives the inputs; nothing is mocked).

The RM runs with a small queue tree and one registered, drained node of 8 GPUs (so specs can be valid while no
AM is ever started): a valid control job is accepted and killed, everything else must be refused.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpurm.common.callers import AM_TOKEN_KEY, USER_KEY
from gpurm.common.limits import ServerLimits
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.rmproc import USER, RMProcess

CODE = grpc.StatusCode
REFUSALS = {CODE.INVALID_ARGUMENT, CODE.NOT_FOUND, CODE.PERMISSION_DENIED}
NODE_ID = "hostile-node-0"
NODE_GPUS = 8
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

QUEUES: dict[str, Any] = {
    "acl": {"admin": [USER]},
    "queues": {
        "default": {"weight": 1, "acl": {"submit": ["*"]}},
        "research": {"weight": 2, "min_gpus": 2, "queues": {
            "nlp": {"min_gpus": 2, "max_gpus": 6, "policy": "las", "acl": {"submit": ["*"]}}}},
        "closed": {"acl": {"submit": ["nobody-at-all"]}},
    },
}
SUBMITTABLE = {"", "default", "root.default", "research.nlp", "root.research.nlp"}

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Any text protobuf can carry: valid UTF-8, so no lone surrogates.
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
LONG_TEXT = st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\x00", ".", "/", "💥"]),
                      st.integers(1_000, 20_000))
ANY_TEXT = TEXT | LONG_TEXT
# What a gRPC metadata value may hold (printable ASCII); never this test's own user, an RM admin.
METADATA_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).filter(
    lambda u: u.strip() != USER) | st.just("x" * 5000)


# ---------------------------------------------------------------- the RM under attack


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    workdir = tmp_path_factory.mktemp("hostile-rm")
    queues = workdir / "queues.yaml"
    queues.write_text(yaml.safe_dump(QUEUES))
    proc = RMProcess(workdir, broker, queues=str(queues))
    try:
        reply = pbg.ResourceTrackerStub(proc.channel).RegisterNode(proc.prove(_registration(NODE_ID)), timeout=10)
        assert reply.session
        proc.admin.DrainNode(pb.DrainNodeRequest(node_id=NODE_ID), metadata=proc.metadata, timeout=10)
        yield proc
    finally:
        code = proc.close()
        assert code == 0, f"the RM exited with {code}:\n{proc.log_text()}"
    errors = [line for line in proc.log_text().splitlines() if re.search(r" (ERROR|CRITICAL) ", line)
              and "Unexpected [DecodeError] raised by servicer method" not in line]   # gRPC's own, for raw bytes
    assert not errors, "\n".join(errors[:20])


def _registration(node_id: str, gpus: int = NODE_GPUS) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id, host="127.0.0.1", agent_port=1, rack="rack-1", ib_domain="ib-1",
        gpus=[pb.GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model="fake", memory_mib=16000, healthy=True)
              for i in range(gpus)],
        cpus=8, memory_mib=64000, agent_version="test", agent_instance=uuid.uuid4().hex, healthy=True)


def serving(rm: RMProcess) -> None:
    """The RM process lives and answers reads."""
    assert rm.proc is not None and rm.proc.poll() is None, f"the RM died:\n{rm.log_text()[-5000:]}"
    rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=10)
    rm.client.ListJobs(pb.ListJobsRequest(limit=1), timeout=10)


def job_ids(rm: RMProcess) -> list[str]:
    return [j.job_id for j in rm.client.ListJobs(pb.ListJobsRequest(), timeout=10).jobs]


def queue_tree(rm: RMProcess) -> list[tuple[Any, ...]]:
    """The queue config in force (shares and usage left out: they move with the cluster, not the config)."""
    return [(q.path, q.weight, q.min_gpus, q.max_gpus, q.leaf, q.preemptible, q.policy, q.max_running_jobs)
            for q in rm.client.ListQueues(pb.ListQueuesRequest(), timeout=10).queues]


def refused(call: Callable[[], Any], fields: tuple[str, ...], codes: set[grpc.StatusCode] = REFUSALS) -> str:
    """Run `call`; it must fail with one of `codes` and details naming one of `fields`. Returns the details."""
    try:
        reply = call()
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        assert code in codes, f"{code.name} (wanted one of {sorted(c.name for c in codes)}): {details}"
        assert any(f in details for f in fields), f"the error names none of {fields}: {details}"
        return details
    raise AssertionError(f"accepted, wanted a refusal naming {fields}: {str(reply)[:500]}")


# ---------------------------------------------------------------- job specs


def _valid_spec() -> pb.JobSpec:
    return pb.JobSpec(name="ok", queue="default", gpus=1, command=["/bin/sh", "-c", "true"], workdir="/tmp",
                      env={"A": "1"}, max_retries=1,
                      locality=pb.LocalitySpec(timeout_ms=1000, backoff_base_ms=1000, backoff_max_ms=2000,
                                               start_level="rack"))


BAD_GPUS = st.integers(INT32[0], 0) | st.integers(NODE_GPUS + 1, INT32[1])
BAD_COMMAND = st.sampled_from([[], [""], ["/bin/sh", "-c"], ["/bin/sh", "-c", "  "], ["a\x00b"],
                               ["x"] * 100_000, ["y" * 3_000_000]])
BAD_NAME = st.builds(lambda s: s * 200, st.text(min_size=1, max_size=3)) | st.sampled_from(["a\nb", "\x07", "\x00"])
BAD_QUEUE = (ANY_TEXT | st.sampled_from(["root", "research", "root.research", "closed", ".", "..", "default.",
                                         ".default", "default\n", "research..nlp", "défault", "q" * 10_000])
             ).filter(lambda q: q not in SUBMITTABLE)
BAD_WORKDIR = TEXT.filter(lambda w: bool(w) and not w.startswith("/")) | st.just("/" + "w" * 100_000)
BAD_ENV_NAME = st.sampled_from(["", "1A", "A-B", "A=B", "A B", "CUDA_VISIBLE_DEVICES", "GPURM_NODE_ID", "GPURM_",
                                "A\n", "É", "A\x00"]) | TEXT.filter(lambda n: not re.fullmatch(r"[A-Za-z_]\w*", n,
                                                                                                re.ASCII))
BAD_RETRIES = st.integers(INT32[0], -1) | st.integers(101, INT32[1])
BAD_DURATION = st.integers(INT64[0], -1) | st.integers(7 * 86400 * 1000 + 1, INT64[1])


def _set_env(spec: pb.JobSpec, name: str, value: str) -> None:
    spec.env[name] = value


def _locality(spec: pb.JobSpec, field: str, value: Any) -> None:
    setattr(spec.locality, field, value)


# field named in the error -> strategy of a change that breaks that field
BREAKERS: dict[str, st.SearchStrategy[Callable[[pb.JobSpec], object]]] = {
    "gpus": BAD_GPUS.map(lambda v: lambda s: setattr(s, "gpus", v)),
    "command": BAD_COMMAND.map(lambda v: lambda s: (s.ClearField("command"), s.command.extend(v))),
    "name": BAD_NAME.map(lambda v: lambda s: setattr(s, "name", v)),
    "queue": BAD_QUEUE.map(lambda v: lambda s: setattr(s, "queue", v)),
    "workdir": BAD_WORKDIR.map(lambda v: lambda s: setattr(s, "workdir", v)),
    "env": st.one_of(
        BAD_ENV_NAME.map(lambda n: lambda s: _set_env(s, n, "v")),
        st.just(lambda s: _set_env(s, "OK", "a\x00b")),
        st.just(lambda s: s.env.update({f"V{i}": "v" for i in range(5000)})),
        st.just(lambda s: _set_env(s, "BIG", "v" * 3_000_000))),
    "max_retries": BAD_RETRIES.map(lambda v: lambda s: setattr(s, "max_retries", v)),
    "locality": st.one_of(
        st.tuples(st.sampled_from(["timeout_ms", "backoff_base_ms", "backoff_max_ms"]), BAD_DURATION).map(
            lambda fv: lambda s: _locality(s, *fv)),
        TEXT.filter(lambda t: t.lower() not in ("", "node", "packed", "rack", "any")).map(
            lambda v: lambda s: _locality(s, "start_level", v))),
}


@st.composite
def broken_specs(draw: st.DrawFn) -> tuple[pb.JobSpec, tuple[str, ...]]:
    """A valid spec with one to three fields broken, and the names of the broken fields."""
    fields = draw(st.lists(st.sampled_from(sorted(BREAKERS)), min_size=1, max_size=3, unique=True))
    spec = _valid_spec()
    for f in fields:
        draw(BREAKERS[f])(spec)
    return spec, tuple(fields)


def _submit(rm: RMProcess, spec: pb.JobSpec, submit_id: str | None = None) -> pb.SubmitJobResponse:
    request = pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex if submit_id is None else submit_id)
    reply: pb.SubmitJobResponse = rm.client.SubmitJob(request, metadata=rm.metadata, timeout=30)
    return reply


def test_a_valid_job_is_accepted_and_can_be_killed(rm: RMProcess) -> None:
    before = job_ids(rm)
    reply = _submit(rm, _valid_spec())
    assert reply.queue == "root.default"
    assert sorted(job_ids(rm)) == sorted([*before, reply.job_id])
    rm.kill_job(reply.job_id)
    assert rm.job(reply.job_id).state == pb.JOB_KILLED


@FAST
@given(case=broken_specs())
def test_a_broken_job_spec_is_refused_naming_its_field_and_creates_nothing(
        rm: RMProcess, case: tuple[pb.JobSpec, tuple[str, ...]]) -> None:
    spec, fields = case
    before = job_ids(rm)
    if pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex).ByteSize() > ServerLimits().max_message_bytes:
        # Too big to read at all (several breakers that each add megabytes): gRPC refuses it before any field is
        # looked at, with the limit in the message (docs/security.md, limits).
        with pytest.raises(grpc.RpcError) as err:
            _submit(rm, spec)
        assert err.value.code() is CODE.RESOURCE_EXHAUSTED and "larger than max" in (err.value.details() or "")
    else:
        refused(lambda: _submit(rm, spec), fields)
    assert job_ids(rm) == before
    serving(rm)


RANDOM_SPECS = st.builds(
    pb.JobSpec, name=ANY_TEXT, queue=st.sampled_from(sorted(SUBMITTABLE)) | ANY_TEXT,
    gpus=st.integers(*INT32), command=st.lists(TEXT, max_size=4), workdir=TEXT | st.just("/tmp"),
    env=st.dictionaries(TEXT, TEXT, max_size=4), max_retries=st.integers(*INT32),
    locality=st.builds(pb.LocalitySpec, timeout_ms=st.integers(*INT64), backoff_base_ms=st.integers(*INT64),
                       backoff_max_ms=st.integers(*INT64), start_level=TEXT))
SPEC_FIELDS = ("gpus", "command", "name", "queue", "workdir", "env", "max_retries", "locality")


@FAST
@given(spec=RANDOM_SPECS, user=st.just(USER) | METADATA_TEXT)
def test_any_job_spec_is_accepted_or_refused_with_a_named_field(rm: RMProcess, spec: pb.JobSpec, user: str) -> None:
    before = job_ids(rm)
    metadata = ((USER_KEY, user),)
    try:
        reply = rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                    metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in REFUSALS, f"{exc.code().name}: {exc.details()}"
        details = exc.details() or ""
        assert any(f"{f}:" in details or f"{f}." in details for f in SPEC_FIELDS), details
        assert job_ids(rm) == before
    else:
        job = rm.job(reply.job_id)
        assert job.spec.gpus == spec.gpus and 1 <= spec.gpus <= NODE_GPUS
        rm.client.KillJob(pb.KillJobRequest(job_id=reply.job_id), metadata=metadata, timeout=10)
    serving(rm)


# ---------------------------------------------------------------- queue configs


def _refresh(rm: RMProcess, text: str) -> pb.RefreshQueuesResponse:
    reply: pb.RefreshQueuesResponse = rm.admin.RefreshQueues(pb.RefreshQueuesRequest(yaml=text),
                                                             metadata=rm.metadata, timeout=60)
    return reply


def _mutate(base: dict[str, Any], path: list[str], key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(base))
    node = out
    for name in path:
        node = node["queues"][name]
    node[key] = value
    return out


QUEUE_PATHS = st.sampled_from([["default"], ["research"], ["research", "nlp"], ["closed"]])
HUGE_INT = st.integers(2**31, 2**200) | st.integers(-(2**200), -1)
BAD_QUEUE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "weight": st.sampled_from([-1, -0.5, "heavy", float("nan"), float("inf"), [], {}, True, 10**400]),
    "min_gpus": HUGE_INT | st.sampled_from([-1, 1.5, "two", [], True]),
    "max_gpus": HUGE_INT | st.sampled_from([-5, "all", 0.5]),
    "max_running_jobs": HUGE_INT | st.sampled_from([-1, "many"]),
    "max_gpus_per_user": HUGE_INT | st.sampled_from([-1, {}]),
    "policy": TEXT.filter(lambda t: t not in ("fifo", "las")) | st.sampled_from(["srtf", 7, None, []]),
    "preemptible": st.sampled_from(["yes", 1, [], 0.0]),
    "acl": st.sampled_from(["*", [], {"submit": [""]}, {"submit": ["@"]}, {"submit": 5}, {"who": ["x"]},
                            {"submit": []}]),
    "queues": st.sampled_from([[], "x", 5, {"root": {}}, {"a.b": {}}, {"": {}}, {7: {}}]),
    "preemption_grace": st.sampled_from(["-1s", "soon", -3, 10**400, "1e999s", [], "9" * 400 + "d"]),
    "fair_share_preemption_threshold": st.sampled_from([-0.1, 1.5, "half", float("nan")]),
    "min_share_preemption_timeout": st.sampled_from(["forever", -1, {}]),
    "nonsense_key": st.integers() | TEXT,
}


@st.composite
def broken_queue_configs(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["field", "min_above_max", "children_mins", "duplicate", "garbage", "deep",
                                 "deep_queues", "bad_names", "bad_acl", "huge", "top"]))
    if kind == "field":
        key = draw(st.sampled_from(sorted(BAD_QUEUE_VALUES)))
        value = draw(BAD_QUEUE_VALUES[key])
        if key == "policy" and value is None:
            value = "nope"
        path = draw(QUEUE_PATHS)
        if value == {"submit": []} and path == ["research"]:
            path = ["default"]   # an empty ACL on a parent is fine while its children name users; on a leaf it is not
        data = _mutate(QUEUES, path, key, value)
        return yaml.dump(data, allow_unicode=True)
    if kind == "min_above_max":
        hi = draw(st.integers(0, 100))
        data = _mutate(QUEUES, ["default"], "min_gpus", hi + draw(st.integers(1, 100)))
        return yaml.safe_dump(_mutate(data, ["default"], "max_gpus", hi))
    if kind == "children_mins":
        return yaml.safe_dump(_mutate(QUEUES, ["research", "nlp"], "min_gpus", draw(st.integers(3, 1000))))
    if kind == "duplicate":
        return yaml.safe_dump(QUEUES) + draw(st.sampled_from(["queues: {}\n", "acl: {}\n"]))
    if kind == "garbage":
        return draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=300) |
                    st.sampled_from(["{", "[", "queues: [", "- a\n- b", "42", "'", "!!python/object:os.system x",
                                     "? [a, b]\n: c\n", "queues:\n  ? [a]\n  : {}\n", "queues:\n  ? {a: 1}\n  : {}\n",
                                     "&a [*a]", "queues: &x {a: *x}", "\t\x00", "---\n---\n"]))
    if kind == "deep":
        depth = draw(st.integers(200, 5000))
        return "queues: " + "{a: " * depth + "{}" + "}" * depth
    if kind == "deep_queues":
        depth = draw(st.integers(33, 300))
        return "acl: {submit: ['*']}\nqueues: " + "{a: {queues: " * depth + "{b: {}}" + "}}" * depth
    if kind == "bad_names":
        name = draw(st.sampled_from(["a\n", "a.b", "root", "", " ", "é", "a b", "x" * 300]))
        data = yaml.safe_load(yaml.safe_dump(QUEUES))
        data["queues"][name] = {"acl": {"submit": ["*"]}}
        return yaml.safe_dump(data, allow_unicode=True)
    if kind == "bad_acl":
        who = draw(st.sampled_from(["alice\n", "@", "", "a b", "@grp\n", "al;ce"]))
        return yaml.safe_dump(_mutate(QUEUES, ["default"], "acl", {"submit": [who]}))
    if kind == "huge":
        n = draw(st.integers(2000, 6000))
        body = "".join(f"  q{i}: {{weight: -1}}\n" for i in range(n))
        return "queues:\n" + body
    top = draw(st.sampled_from(["defaults", "acl", "policy", "queues", "extra"]))
    value = draw(st.sampled_from([5, "x", [], {"bogus": 1}, {"preemption_grace": "never!"}]))
    data = dict(QUEUES)
    data[top] = value
    return yaml.safe_dump(data)


@QUICK
@given(text=broken_queue_configs())
def test_a_bad_queue_config_is_refused_with_its_errors_and_the_old_tree_stays(rm: RMProcess, text: str) -> None:
    before = queue_tree(rm)
    reply = _refresh(rm, text)
    assert not reply.applied, f"applied:\n{text[:2000]}"
    assert reply.errors and all(e.strip() for e in reply.errors)
    assert queue_tree(rm) == before
    serving(rm)


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["weight", "min_gpus", "max_gpus", "queues", "acl", "submit", "policy", "default", "nlp",
                         "preemptible", "max_running_jobs", "preemption_grace"]) | TEXT, inner, max_size=4),
    max_leaves=20)


@QUICK
@given(data=st.dictionaries(st.sampled_from(["queues", "acl", "defaults", "policy"]) | TEXT, YAML_VALUES,
                            max_size=4))
def test_any_queue_config_is_applied_whole_or_refused_whole(rm: RMProcess, data: dict[str, Any]) -> None:
    before = queue_tree(rm)
    reply = _refresh(rm, yaml.safe_dump(data, allow_unicode=True))
    if reply.applied:
        assert not reply.errors
        assert queue_tree(rm) == [(q.path, q.weight, q.min_gpus, q.max_gpus, q.leaf, q.preemptible, q.policy,
                                   q.max_running_jobs) for q in reply.queues]
        restored = _refresh(rm, yaml.safe_dump(QUEUES))
        assert restored.applied, restored.errors
    else:
        assert reply.errors and all(e.strip() for e in reply.errors)
    assert queue_tree(rm) == before
    serving(rm)


def test_queue_refresh_is_for_admins_only(rm: RMProcess) -> None:
    before = queue_tree(rm)
    for user in ("mallory", "", "x" * 4000):
        request = pb.RefreshQueuesRequest(yaml=yaml.safe_dump(QUEUES))
        refused(functools.partial(rm.admin.RefreshQueues, request, metadata=((USER_KEY, user),), timeout=10),
                ("admin",), {CODE.PERMISSION_DENIED})
    assert queue_tree(rm) == before


def test_a_queue_config_that_strands_a_job_is_refused(rm: RMProcess) -> None:
    job = _submit(rm, pb.JobSpec(gpus=1, queue="research.nlp", command=["true"])).job_id
    try:
        before = queue_tree(rm)
        data = yaml.safe_load(yaml.safe_dump(QUEUES))
        del data["queues"]["research"]
        reply = _refresh(rm, yaml.safe_dump(data))
        assert not reply.applied and any("research" in e for e in reply.errors), reply.errors
        assert queue_tree(rm) == before
    finally:
        rm.kill_job(job)


# ---------------------------------------------------------------- malformed fields to the other RPCs


JOB_IDS = ANY_TEXT.filter(lambda j: not re.fullmatch(r"job-\d+", j))


@FAST
@given(job_id=JOB_IDS, rank=st.integers(*INT32), attempt=st.integers(*INT32), offset=st.integers(*INT64),
       max_bytes=st.integers(*INT32), am=st.booleans(), reason=ANY_TEXT)
def test_unknown_job_ids_are_not_found(rm: RMProcess, job_id: str, rank: int, attempt: int, offset: int,
                                       max_bytes: int, am: bool, reason: str) -> None:
    before = job_ids(rm)
    nf = {CODE.NOT_FOUND, CODE.INVALID_ARGUMENT}
    refused(lambda: rm.client.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10), ("job_id",), nf)
    refused(lambda: rm.client.KillJob(pb.KillJobRequest(job_id=job_id, reason=reason), metadata=rm.metadata,
                                      timeout=10), ("job_id",), nf)
    refused(lambda: rm.client.GetLogs(pb.GetLogsRequest(job_id=job_id, rank=rank, attempt=attempt, offset=offset,
                                                        max_bytes=max_bytes, am=am), timeout=10), ("job_id",), nf)
    assert job_ids(rm) == before
    serving(rm)


@QUICK
@given(rank=st.integers(*INT32), attempt=st.integers(*INT32), offset=st.integers(*INT64),
       max_bytes=st.integers(*INT32), am=st.booleans())
def test_logs_of_a_job_that_never_ran_are_refused(rm: RMProcess, rank: int, attempt: int, offset: int,
                                                  max_bytes: int, am: bool) -> None:
    job = _submit(rm, _valid_spec(), submit_id="logs-job").job_id
    refused(lambda: rm.client.GetLogs(pb.GetLogsRequest(job_id=job, rank=rank, attempt=attempt, offset=offset,
                                                        max_bytes=max_bytes, am=am), timeout=10),
            (job,), REFUSALS | {CODE.FAILED_PRECONDITION})
    serving(rm)


@QUICK
@given(states=st.lists(st.integers(*INT32), max_size=5), queue=ANY_TEXT, user=ANY_TEXT, limit=st.integers(*INT32))
def test_any_job_listing_query_is_answered(rm: RMProcess, states: list[int], queue: str, user: str,
                                           limit: int) -> None:
    reply = rm.client.ListJobs(pb.ListJobsRequest(states=states, queue=queue, user=user, limit=limit), timeout=10)
    assert limit <= 0 or len(reply.jobs) <= limit


@QUICK
@given(node_id=ANY_TEXT.filter(lambda n: n != NODE_ID), undrain=st.booleans(), user=METADATA_TEXT)
def test_draining_an_unknown_node_is_not_found(rm: RMProcess, node_id: str, undrain: bool, user: str) -> None:
    before = rm.nodes()
    refused(lambda: rm.admin.DrainNode(pb.DrainNodeRequest(node_id=node_id, undrain=undrain),
                                       metadata=rm.metadata, timeout=10), ("node_id",), {CODE.NOT_FOUND})
    refused(lambda: rm.admin.DrainNode(pb.DrainNodeRequest(node_id=NODE_ID, undrain=True),
                                       metadata=((USER_KEY, user),), timeout=10), ("admin",),
            {CODE.PERMISSION_DENIED})
    assert rm.nodes() == before


def _gpu_dupes(r: pb.RegisterNodeRequest) -> None:
    r.gpus.append(pb.GpuInfo(index=0))


BREAK_NODE: dict[str, st.SearchStrategy[Callable[[pb.RegisterNodeRequest], object]]] = {
    "node_id": st.sampled_from(["", "n" * 129, "n" * 100_000]).map(lambda v: lambda r: setattr(r, "node_id", v)),
    "agent_port": st.integers(INT32[0], 0).map(lambda v: lambda r: setattr(r, "agent_port", v))
    | st.integers(65536, INT32[1]).map(lambda v: lambda r: setattr(r, "agent_port", v)),
    "gpus": st.one_of(
        st.just(_gpu_dupes),
        st.integers(INT32[0], -1).map(lambda v: lambda r: r.gpus.append(pb.GpuInfo(index=v))),
        st.just(lambda r: r.gpus.extend(pb.GpuInfo(index=i) for i in range(100, 2000))),
        st.integers(INT64[0], -1).map(lambda v: lambda r: setattr(r.gpus[0], "memory_mib", v))),
    "cpus": st.integers(INT32[0], -1).map(lambda v: lambda r: setattr(r, "cpus", v)),
    "memory_mib": st.integers(INT64[0], -1).map(lambda v: lambda r: setattr(r, "memory_mib", v)),
    "host": st.just(lambda r: setattr(r, "host", "h" * 100_000)),
    "rack": st.just(lambda r: setattr(r, "rack", "r" * 100_000)),
    "ib_domain": st.just(lambda r: setattr(r, "ib_domain", "i" * 100_000)),
}


@st.composite
def broken_registrations(draw: st.DrawFn) -> tuple[pb.RegisterNodeRequest, tuple[str, ...]]:
    fields = draw(st.lists(st.sampled_from(sorted(BREAK_NODE)), min_size=1, max_size=3, unique=True))
    reg = _registration(draw(st.sampled_from(["hostile-new", NODE_ID])))
    for f in fields:
        draw(BREAK_NODE[f])(reg)
    return reg, tuple(fields)


@FAST
@given(case=broken_registrations())
def test_a_broken_node_registration_is_refused_and_changes_nothing(
        rm: RMProcess, case: tuple[pb.RegisterNodeRequest, tuple[str, ...]]) -> None:
    reg, fields = case
    before = rm.nodes()
    tracker = pbg.ResourceTrackerStub(rm.channel)
    refused(lambda: tracker.RegisterNode(reg, timeout=10), fields, {CODE.INVALID_ARGUMENT})
    assert rm.nodes() == before
    serving(rm)


BEATS = st.builds(
    pb.NodeHeartbeat, node_id=st.sampled_from([NODE_ID, ""]) | ANY_TEXT, session=TEXT, seq=st.integers(*INT64),
    containers=st.lists(st.builds(pb.ContainerStatus, container_id=TEXT, job_id=TEXT,
                                  state=st.integers(*INT32), pid=st.integers(*INT32),
                                  exit_code=st.integers(*INT32)), max_size=3),
    gpu_health=st.lists(st.builds(pb.GpuInfo, index=st.integers(*INT32), healthy=st.booleans()), max_size=3),
    healthy=st.booleans(), health_report=ANY_TEXT)


@QUICK
@given(beats=st.lists(BEATS, min_size=1, max_size=4))
def test_heartbeats_from_strangers_are_told_to_register(rm: RMProcess, beats: list[pb.NodeHeartbeat]) -> None:
    """Without the session the RM handed out, a beat changes nothing: the answer is REREGISTER."""
    before = rm.nodes()
    tracker = pbg.ResourceTrackerStub(rm.channel)
    replies = list(tracker.Heartbeat(iter(beats), timeout=10))
    assert replies and all(r.action == pb.HEARTBEAT_REREGISTER for r in replies)
    assert rm.nodes() == before
    serving(rm)


def test_garbage_in_a_registered_nodes_heartbeat_is_survived(rm: RMProcess) -> None:
    tracker = pbg.ResourceTrackerStub(rm.channel)
    node = "hostile-beater"
    session = tracker.RegisterNode(rm.prove(_registration(node, gpus=2)), timeout=10).session
    rm.admin.DrainNode(pb.DrainNodeRequest(node_id=node), metadata=rm.metadata, timeout=10)
    beats = [pb.NodeHeartbeat(node_id=node, session=session, seq=i, healthy=True, containers=[
        pb.ContainerStatus(container_id=cid, job_id="job-1", state=state, exit_code=-(2**31), pid=-1)],
        gpu_health=[pb.GpuInfo(index=idx, healthy=False, health_reason="x" * 5000)],
        usage=[pb.ContainerUsage(container_id="nope", summary="y" * 10_000)])
        for i, (cid, state, idx) in enumerate([("", 0, -1), ("job-1-c999", 2, 99), ("x" * 10_000, 99, 2**31 - 1),
                                               ("job-1-am1", pb.CONTAINER_EXITED, 1)])]
    replies = list(tracker.Heartbeat(iter(beats), timeout=10))
    assert [r.ack_seq for r in replies if r.ack_seq or r.action] == [0, 1, 2, 3][:len(replies)]
    assert len(replies) >= len(beats)
    gpus = {g.index: g for g in rm.nodes()[node].gpus}
    assert set(gpus) == {0, 1} and not gpus[1].healthy
    serving(rm)


AM_CALLS = st.sampled_from(["register", "allocate", "finish"])


def _am_call(rm: RMProcess, which: str, job_id: str, attempt: int, token: str, **fields: Any) -> Any:
    am = pbg.ApplicationMasterStub(rm.channel)
    md = ((AM_TOKEN_KEY, token),)
    if which == "register":
        return am.RegisterApplicationMaster(pb.RegisterAMRequest(job_id=job_id, am_attempt=attempt, host="h"),
                                            metadata=md, timeout=10)
    if which == "allocate":
        return am.Allocate(pb.AllocateRequest(job_id=job_id, am_attempt=attempt, **fields), metadata=md, timeout=10)
    return am.FinishApplicationMaster(pb.FinishAMRequest(job_id=job_id, am_attempt=attempt, **fields),
                                      metadata=md, timeout=10)


ASKS = st.lists(st.builds(pb.ResourceAsk, node_id=TEXT, rack=TEXT, gpus=st.integers(*INT32),
                          count=st.integers(*INT32), gpu_indices=st.lists(st.integers(*INT32), max_size=3)),
                max_size=3)


@FAST
@given(which=AM_CALLS, job_id=ANY_TEXT, attempt=st.integers(*INT32), token=METADATA_TEXT | st.text("0123456789abcdef",
       min_size=64, max_size=64), response_id=st.integers(*INT64), asks=ASKS, releases=st.lists(TEXT, max_size=3),
       final_state=st.integers(*INT32))
def test_am_calls_without_the_am_token_are_refused(rm: RMProcess, which: str, job_id: str, attempt: int,
                                                   token: str, response_id: int, asks: list[pb.ResourceAsk],
                                                   releases: list[str], final_state: int) -> None:
    before = [_without_forecast(rm.client.GetJob(pb.GetJobRequest(job_id=j), timeout=10)) for j in job_ids(rm)]
    fields: dict[str, Any] = ({"response_id": response_id, "asks": asks, "releases": releases}
                              if which == "allocate" else {"final_state": final_state} if which == "finish" else {})
    refused(lambda: _am_call(rm, which, job_id, attempt, token, **fields), ("AM token",), {CODE.PERMISSION_DENIED})
    assert [_without_forecast(rm.client.GetJob(pb.GetJobRequest(job_id=j.job_id), timeout=10)) for j in before] \
        == before
    serving(rm)


@QUICK
@given(which=AM_CALLS, job_id=JOB_IDS | st.sampled_from(["job-999999", "job-0", "job--1"]),
       attempt=st.integers(*INT32))
def test_am_calls_for_unknown_jobs_are_not_found(rm: RMProcess, which: str, job_id: str, attempt: int) -> None:
    token = rm.am_token(job_id, attempt)
    fields: dict[str, Any] = {"final_state": pb.JOB_SUCCEEDED} if which == "finish" else {}
    refused(lambda: _am_call(rm, which, job_id, attempt, token, **fields), ("job_id",), {CODE.NOT_FOUND})
    serving(rm)


@QUICK
@given(asks=ASKS.filter(lambda a: any(x.gpus < 1 or not 0 <= x.count <= 4096 for x in a)))
def test_an_am_asking_for_impossible_containers_is_refused(rm: RMProcess, asks: list[pb.ResourceAsk]) -> None:
    job = _submit(rm, _valid_spec(), submit_id="am-asks-job").job_id
    before = _without_forecast(rm.job(job))
    token = rm.am_token(job, before.am_attempt)
    refused(lambda: _am_call(rm, "allocate", job, before.am_attempt, token, asks=asks), ("asks",),
            {CODE.INVALID_ARGUMENT})
    refused(lambda: _am_call(rm, "finish", job, before.am_attempt, token, final_state=99), ("final_state",),
            {CODE.INVALID_ARGUMENT})
    assert _without_forecast(rm.job(job)) == before
    serving(rm)


def _without_forecast(job: pb.Job) -> pb.Job:
    """The job as the request could change it: its start-time forecast is remade every round, whatever came in."""
    job.ClearField("forecast")
    return job


# ---------------------------------------------------------------- bytes that are not protobuf at all


def _methods() -> dict[str, type[Any]]:
    """Every RM method's full name and its request message type."""
    names = {}
    for service in pb.DESCRIPTOR.services_by_name.values():
        if service.name == "ContainerManager":
            continue  # served by agents, not the RM
        for m in service.methods:
            names[f"/{service.full_name}/{m.name}"] = getattr(pb, m.input_type.name)
    return dict(sorted(names.items()))


METHODS = _methods()
STREAMING = {"/gpurm.ResourceTracker/Heartbeat"}


def _raw(channel: grpc.Channel, method: str, payload: bytes) -> None:
    def ident(b: bytes) -> bytes:
        return b

    if method in STREAMING:
        list(channel.stream_stream(method, request_serializer=ident, response_deserializer=ident)(
            iter([payload, payload]), timeout=10))
    else:
        channel.unary_unary(method, request_serializer=ident, response_deserializer=ident)(
            payload, metadata=((USER_KEY, USER),), timeout=10)


def test_the_method_list_covers_the_rm(rm: RMProcess) -> None:
    assert "/gpurm.Client/SubmitJob" in METHODS and "/gpurm.Admin/RefreshQueues" in METHODS
    assert "/gpurm.ApplicationMaster/Allocate" in METHODS and "/gpurm.ResourceTracker/Heartbeat" in METHODS


def _parses(message: type[Any], payload: bytes) -> bool:
    try:
        message.FromString(payload)
    except Exception:
        return False
    return True


@FAST
@given(method=st.sampled_from(sorted(METHODS)), payload=st.binary(min_size=1, max_size=2000)
       | st.sampled_from([b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", b"\x1a\x05\xff\xfe\xfd\xfc\xfb", b"\x08",
                          b"\x00", b"\x0a\x02\xc3\x28",
                          b"\x0a\x04\x22\x02\xc3\x28"]))   # a SubmitJobRequest whose command is not UTF-8
def test_bytes_that_are_not_a_message_are_refused_and_survived(rm: RMProcess, method: str, payload: bytes) -> None:
    before_jobs, before_tree, before_nodes = job_ids(rm), queue_tree(rm), sorted(rm.nodes())
    try:
        _raw(rm.channel, method, payload)
    except grpc.RpcError as exc:
        assert exc.code() not in (CODE.UNKNOWN, CODE.INTERNAL), f"{exc.code().name}: {exc.details()}"
        if not _parses(METHODS[method], payload):
            assert exc.code() is CODE.INVALID_ARGUMENT and "request:" in (exc.details() or ""), exc.details()
    else:
        assert _parses(METHODS[method], payload), "an undecodable request was answered"
    serving(rm)
    if method != "/gpurm.Client/SubmitJob":
        assert job_ids(rm) == before_jobs
    assert queue_tree(rm) == before_tree
    if not method.startswith("/gpurm.ResourceTracker/"):
        assert sorted(rm.nodes()) == before_nodes
    else:
        for node_id in set(rm.nodes()) - set(before_nodes):   # bytes that happened to make a registration
            rm.drain(node_id)
