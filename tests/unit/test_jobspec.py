"""Job specs: YAML parsing, validation errors naming the field, wire round trip."""

from __future__ import annotations

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import (
    LocalityLevel,
    LocalityMode,
    Placement,
    parse_job_yaml,
    spec_from_proto,
    spec_to_proto,
)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_job_yaml(text, "job.yaml")
    return info.value.problems


def test_string_command_runs_with_sh_and_defaults_apply() -> None:
    spec = parse_job_yaml("name: t\ngpus: 2\ncommand: echo hi && exit 0\n")
    assert spec.command == ["/bin/sh", "-c", "echo hi && exit 0"]
    assert spec.command_text == "echo hi && exit 0"
    assert spec.max_retries == 3
    assert spec.locality.timeout_s == 60 and spec.locality.backoff_base_s == 10
    assert spec.locality.backoff_max_s == 600 and spec.locality.start_level is LocalityLevel.PACKED


def test_list_command_runs_as_is_and_all_fields_read() -> None:
    spec = parse_job_yaml(
        "name: t\nqueue: research.nlp\ngpus: 16\ncommand: [python, train.py, --lr, 0.1]\n"
        "workdir: /tmp\nenv: {A: 1, B: x}\nmax_retries: 0\n"
        "locality: {timeout: 90s, backoff_base: 5s, backoff_max: 2m, start_level: rack}\n")
    assert spec.command == ["python", "train.py", "--lr", "0.1"]
    assert spec.env == {"A": "1", "B": "x"}
    assert spec.max_retries == 0 and spec.queue == "research.nlp" and spec.workdir == "/tmp"
    assert (spec.locality.timeout_s, spec.locality.backoff_base_s, spec.locality.backoff_max_s) == (90, 5, 120)
    assert spec.locality.start_level is LocalityLevel.RACK


def test_yaml_that_does_not_parse_names_the_line() -> None:
    (p,) = problems("gpus: 1\ncommand: [unclosed\n")
    assert "not valid YAML" in p and "line" in p


def test_unknown_key_is_named_with_a_suggestion() -> None:
    (p,) = problems("gpus: 1\ncommand: x\ngpu: 2\n")
    assert "gpu" in p and "unknown field" in p and "did you mean 'gpus'" in p


def test_missing_command() -> None:
    assert any("command" in p and "required" in p for p in problems("gpus: 1\n"))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "true"])
def test_bad_gpus(value: str) -> None:
    assert any(p.startswith("job.yaml: gpus") for p in problems(f"gpus: {value}\ncommand: x\n"))


def test_reserved_env_and_bad_level_and_every_problem_reported() -> None:
    ps = problems("gpus: 1\ncommand: x\nenv: {CUDA_VISIBLE_DEVICES: 0}\nlocality: {start_level: near}\n")
    assert any("env.CUDA_VISIBLE_DEVICES" in p for p in ps)
    assert any("locality.start_level" in p for p in ps)


def test_empty_file() -> None:
    assert "empty" in problems("")[0]


def test_proto_round_trip_keeps_everything() -> None:
    spec = parse_job_yaml("name: t\ngpus: 3\ncommand: [a, b]\nmax_retries: 0\nworkdir: /w\n"
                          "locality: {timeout: 5s, start_level: any}\n")
    back = spec_from_proto(spec_to_proto(spec))
    assert back == spec


def test_wire_spec_is_validated_again() -> None:
    msg = spec_to_proto(parse_job_yaml("gpus: 1\ncommand: x\n"))
    msg.gpus = -1
    msg.env["GPURM_JOB_ID"] = "x"
    with pytest.raises(ConfigError) as info:
        spec_from_proto(msg)
    assert any("gpus" in p for p in info.value.problems)
    assert any("GPURM_JOB_ID" in p for p in info.value.problems)


def test_locality_shorthand_sets_the_mode_and_keeps_the_defaults() -> None:
    spec = parse_job_yaml("gpus: 16\ncommand: x\nlocality: strict\n")
    assert spec.locality.mode is LocalityMode.STRICT
    assert spec.locality.start_level is LocalityLevel.PACKED and spec.locality.timeout_s == 60
    assert parse_job_yaml("gpus: 1\ncommand: x\nlocality: any\n").locality.mode is LocalityMode.ANY
    assert parse_job_yaml("gpus: 1\ncommand: x\n").locality.mode is LocalityMode.PREFER


def test_locality_mode_inside_the_mapping() -> None:
    spec = parse_job_yaml("gpus: 16\ncommand: x\nlocality: {mode: strict, timeout: 2m, start_level: node}\n")
    assert spec.locality.mode is LocalityMode.STRICT and spec.locality.timeout_s == 120
    assert spec.locality.start_level is LocalityLevel.NODE


def test_bad_locality_modes_name_the_field() -> None:
    ps = problems("gpus: 1\ncommand: x\nlocality: sometimes\n")
    assert len(ps) == 1 and ps[0].startswith("job.yaml: locality:") and "strict, prefer, any" in ps[0]
    ps = problems("gpus: 1\ncommand: x\nlocality: {mode: loose}\n")
    assert len(ps) == 1 and "locality.mode:" in ps[0] and "'loose'" in ps[0]
    ps = problems("gpus: 1\ncommand: x\nlocality: {mod: strict}\n")
    assert any("locality.mod" in p and "mode" in p for p in ps)


def test_the_mode_travels_on_the_wire_and_a_bad_one_is_refused() -> None:
    spec = parse_job_yaml("gpus: 2\ncommand: x\nlocality: {mode: any, start_level: rack}\n")
    assert spec_from_proto(spec_to_proto(spec)) == spec
    msg = spec_to_proto(spec)
    msg.locality.mode = "never"
    with pytest.raises(ConfigError) as info:
        spec_from_proto(msg)
    assert any(p.startswith("locality.mode:") for p in info.value.problems)


def test_placement_defaults_to_pack_and_spread_is_read() -> None:
    assert parse_job_yaml("gpus: 4\ncommand: x\n").placement is Placement.PACK
    spec = parse_job_yaml("gpus: 4\ncommand: x\nplacement: spread\nlocality: strict\n")
    assert spec.placement is Placement.SPREAD and spec.locality.mode is LocalityMode.STRICT
    assert parse_job_yaml("gpus: 4\ncommand: x\nplacement: SPREAD\n").placement is Placement.SPREAD


@pytest.mark.parametrize("value", ["scatter", "1", "[spread]", "{a: b}", "'" + "x" * 500 + "'"])
def test_bad_placement_names_the_field(value: str) -> None:
    ps = problems(f"gpus: 1\ncommand: x\nplacement: {value}\n")
    assert len(ps) == 1 and ps[0].startswith("job.yaml: placement:") and "pack, spread" in ps[0], ps
    assert len(ps[0]) < 200        # a huge value is clipped in the error


def test_placement_travels_on_the_wire_and_a_bad_one_is_refused() -> None:
    spec = parse_job_yaml("gpus: 4\ncommand: x\nplacement: spread\n")
    msg = spec_to_proto(spec)
    assert msg.placement == "spread"
    assert spec_from_proto(msg) == spec
    # pack is the wire's empty default: a spec from a client that predates the field is a pack job
    assert spec_to_proto(parse_job_yaml("gpus: 4\ncommand: x\n")).placement == ""
    msg.placement = "wide"
    with pytest.raises(ConfigError) as info:
        spec_from_proto(msg)
    assert any(p.startswith("placement:") and "'wide'" in p for p in info.value.problems)
