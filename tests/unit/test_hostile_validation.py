"""Validation that hostile input (tests/integration/test_hostile_input.py) found missing: each case is refused
with an error naming its field, never with a crash."""

from __future__ import annotations

import pytest

from gpurm.common.fields import ConfigError, Problems, Reader, parse_duration
from gpurm.common.jobspec import JobSpec, spec_from_proto, validate_spec
from gpurm.proto import gpurm_pb2 as pb
from gpurm.queues.config import MAX_COUNT, parse_queues
from gpurm.rm.server.service import registration_problems, status_details

GOOD_QUEUES = "queues:\n  default:\n    acl: {submit: ['*']}\n"


def queue_problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_queues(text, "q.yaml")
    return info.value.problems


def spec_problems(**fields: object) -> list[str]:
    spec = JobSpec(gpus=1, command=["/bin/true"])
    for key, value in fields.items():
        setattr(spec, key, value)
    return validate_spec(spec)


# ---------------------------------------------------------------- job specs


@pytest.mark.parametrize("name", ["A\n", "1A", "A-B", "", "É"])
def test_an_env_name_with_a_trailing_newline_or_odd_characters_is_refused(name: str) -> None:
    assert any(p.startswith("env.") and "not a valid environment variable name" in p
               for p in spec_problems(env={name: "v"}))


def test_a_queue_name_with_a_trailing_newline_is_refused() -> None:
    assert any(p.startswith("queue:") for p in spec_problems(queue="default\n"))


def test_a_huge_command_env_or_workdir_is_refused_naming_the_field() -> None:
    assert any(p.startswith("command: at most") for p in spec_problems(command=["x"] * 100_000))
    assert any(p.startswith("command: at most") for p in spec_problems(command=["y" * 2_000_000]))
    assert any(p.startswith("env: at most") for p in spec_problems(env={f"V{i}": "v" for i in range(5000)}))
    assert any(p.startswith("env: at most") for p in spec_problems(env={"BIG": "v" * 2_000_000}))
    assert any(p.startswith("workdir: at most") for p in spec_problems(workdir="/" + "w" * 5000))


def test_a_long_bad_value_is_quoted_short() -> None:
    (problem,) = spec_problems(workdir="w" * 100_000)
    assert problem.startswith("workdir: must be an absolute path") and len(problem) < 200


def test_a_sane_large_spec_still_passes() -> None:
    assert spec_problems(command=["python", *(f"--arg{i}" for i in range(1000))],
                         env={f"V{i}": "x" * 100 for i in range(500)}, workdir="/data/" + "d" * 200) == []


def test_a_wire_spec_with_a_huge_queue_is_refused_shortly() -> None:
    with pytest.raises(ConfigError) as info:
        spec_from_proto(pb.JobSpec(gpus=1, command=["true"], queue="q" * 10_000 + "!"))
    assert info.value.problems[0].startswith("queue:") and len(info.value.problems[0]) < 200


# ---------------------------------------------------------------- queue configs


def test_yaml_nested_too_deeply_is_refused_not_a_crash() -> None:
    (problem,) = queue_problems("queues: " + "{a: " * 5000 + "{}" + "}" * 5000)
    assert "nested too deeply" in problem


def test_unprintable_characters_are_refused_as_invalid_yaml() -> None:
    (problem,) = queue_problems("\x1e")
    assert problem.startswith("q.yaml: not valid YAML")


@pytest.mark.parametrize("text", ["? [a, b]\n: c\n", "queues:\n  ? {a: 1}\n  : {}\n"])
def test_an_unhashable_key_is_refused_as_invalid_yaml(text: str) -> None:
    (problem,) = queue_problems(text)
    assert "not valid YAML" in problem and "unhashable" in problem


@pytest.mark.parametrize("field", ["min_gpus", "max_gpus", "max_running_jobs", "max_gpus_per_user"])
def test_counts_beyond_any_cluster_are_refused(field: str) -> None:
    value = 42024009776986
    problems = queue_problems(GOOD_QUEUES + f"    {field}: {value}\n")
    assert f"q.yaml: root.default.{field}: must be at most {MAX_COUNT}, got {value}" in problems


@pytest.mark.parametrize("value", ["10" + "0" * 400, "1.0e+7", ".inf"])
def test_a_weight_too_large_for_a_float_or_absurd_is_refused(value: str) -> None:
    assert any("root.default.weight: must be" in p for p in queue_problems(GOOD_QUEUES + f"    weight: {value}\n"))


@pytest.mark.parametrize("field", ["preemption_grace", "min_share_preemption_timeout"])
def test_durations_beyond_a_year_or_a_float_are_refused(field: str) -> None:
    for value in ("1" + "0" * 400, "400d"):
        assert any(f"root.default.{field}: must" in p for p in queue_problems(GOOD_QUEUES + f"    {field}: {value}\n"))


@pytest.mark.parametrize("name", ['"a\\n"', "x" * 65])
def test_queue_names_with_a_newline_or_too_long_are_refused(name: str) -> None:
    text = GOOD_QUEUES + f"  {name}:\n    acl: {{submit: ['*']}}\n"
    assert any("queue names use letters" in p for p in queue_problems(text))


def test_acl_entries_with_a_trailing_newline_are_refused() -> None:
    problems = queue_problems('queues:\n  default:\n    acl: {submit: ["alice\\n"]}\n')
    assert any("root.default.acl.submit" in p and "is not a user" in p for p in problems)


def test_queues_nest_at_most_32_levels() -> None:
    deep = "acl: {submit: ['*']}\nqueues: " + "{a: {queues: " * 40 + "{b: {}}" + "}}" * 40
    assert any("queues nest at most 32 levels" in p for p in queue_problems(deep))
    ok = "acl: {submit: ['*']}\nqueues: " + "{a: {queues: " * 10 + "{b: {}}" + "}}" * 10
    assert parse_queues(ok).find("a." * 10 + "b") is not None


def test_parse_duration_and_reader_limits() -> None:
    with pytest.raises(ValueError, match="below 1e300"):
        parse_duration(10**400)
    p = Problems()
    r = Reader({"n": 10**50, "d": "2d", "w": 10**400}, "x", p)
    assert r.integer("n", 0, maximum=5) == 5
    assert r.duration("d", 0.0, maximum=3600.0) == 3600.0
    assert r.number("w", 1.0) == 1.0
    assert len(p.items) == 3 and all(i.startswith("x.") for i in p.items)


# ---------------------------------------------------------------- RPC edges


def test_status_details_fit_a_grpc_trailer_and_keep_every_problem() -> None:
    text = status_details("a: " + "é" * 10_000, "b: short")
    assert len(text.encode()) <= 2000 and "b: short" in text and text.startswith("a: ")
    assert status_details("plain") == "plain"


def _registration(**fields: object) -> pb.RegisterNodeRequest:
    msg = pb.RegisterNodeRequest(node_id="n1", host="h", agent_port=1, rack="r",
                                 gpus=[pb.GpuInfo(index=0), pb.GpuInfo(index=1)], cpus=8, memory_mib=1000)
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def test_a_sound_registration_has_no_problems() -> None:
    assert registration_problems(_registration()) == []


@pytest.mark.parametrize(("fields", "named"), [
    ({"cpus": -1}, "cpus:"), ({"memory_mib": -5}, "memory_mib:"), ({"host": "h" * 300}, "host:"),
    ({"rack": "r" * 300}, "rack:"), ({"ib_domain": "i" * 300}, "ib_domain:"), ({"node_id": ""}, "node_id:"),
    ({"agent_port": 70000}, "agent_port:")])
def test_a_bad_registration_names_its_field(fields: dict[str, object], named: str) -> None:
    assert any(p.startswith(named) for p in registration_problems(_registration(**fields)))


def test_bad_gpus_in_a_registration_are_named() -> None:
    msg = _registration()
    msg.gpus.append(pb.GpuInfo(index=1))
    msg.gpus[0].memory_mib = -1
    problems = registration_problems(msg)
    assert any(p.startswith("gpus: indices must be distinct") for p in problems)
    assert any(p.startswith("gpus[0].memory_mib") for p in problems)
