"""Properties over every field of the job spec and of the API's job body, walked from the
schema itself (a field added later is covered too): a value of the wrong kind or outside
its rule is refused with that field named, never coerced; a valid one round-trips (through
the dumped dict, and through YAML text for the spec)."""

from __future__ import annotations

import copy
import math
import types
import typing
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fm_pipeline.api.schemas import JobCreate
from fm_pipeline.config import JobSpec, JobSpecError, dump_job, parse_job
from fm_pipeline.config.load import set_dotted
from fm_pipeline.config.strict_yaml import dump_yaml, load_yaml
from fm_pipeline.data.testing import SMALL_JOB

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass(frozen=True)
class Leaf:
    path: str
    kind: type | tuple  # int, float, bool, str, or a tuple of Literal choices
    optional: bool
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None


def _unwrap(annotation):
    """(inner annotation, optional) for `X | None`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else annotation), True
    return annotation, False


def leaves(model: type[BaseModel], prefix: str = "") -> list[Leaf]:
    """Every scalar field of `model`, recursively through nested models (not lists)."""
    out = []
    for name, field in model.model_fields.items():
        annotation, optional = _unwrap(field.annotation)
        path = f"{prefix}{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += leaves(annotation, f"{path}.")
            continue
        if typing.get_origin(annotation) is typing.Literal:
            kind = typing.get_args(annotation)
        elif annotation in (int, float, bool, str):
            kind = annotation
        else:
            continue  # lists and mappings: covered by their own tests
        bounds = {k: getattr(m, k) for m in field.metadata for k in ("gt", "ge", "lt", "le")
                  if getattr(m, k, None) is not None}
        out.append(Leaf(path, kind, optional, **bounds))
    return out


SPEC_LEAVES = [leaf for leaf in leaves(JobSpec) if not leaf.path.startswith("data.")]
BODY_LEAVES = leaves(JobCreate)


def wrong_kind(leaf: Leaf) -> st.SearchStrategy:
    """Values a lenient parser would coerce or accept, but that are not of the field's kind."""
    finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
    numeric_text = st.one_of(st.integers(-1000, 1000).map(str), finite.map(repr))
    if leaf.kind is int:
        return st.one_of(st.booleans(), numeric_text,
                         finite.filter(lambda x: not float(x).is_integer()),
                         st.sampled_from([math.nan, math.inf, -math.inf]))
    if leaf.kind is float:
        return st.one_of(st.booleans(), numeric_text,
                         st.sampled_from([math.nan, math.inf, -math.inf]))
    if leaf.kind is bool:
        return st.one_of(st.integers(0, 1), st.sampled_from(["true", "yes", "on", "1"]))
    if leaf.kind is str:
        return st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False))
    return st.text(min_size=1, max_size=12).filter(lambda s: s not in leaf.kind)  # Literal


def out_of_range(leaf: Leaf) -> st.SearchStrategy | None:
    if leaf.kind not in (int, float):
        return None
    cast = int if leaf.kind is int else float
    bad = []
    if leaf.gt is not None:
        bad.append(st.just(cast(leaf.gt)))
    if leaf.ge is not None:
        bad.append(st.just(cast(leaf.ge) - 1))
    if leaf.lt is not None:
        bad.append(st.just(cast(leaf.lt)))
    if leaf.le is not None:
        bad.append(st.just(cast(leaf.le) + 1))
    return st.one_of(bad) if bad else None


def invalid_values(leaves_: list[Leaf]) -> st.SearchStrategy:
    def for_leaf(leaf: Leaf):
        options = [wrong_kind(leaf)]
        if (rng := out_of_range(leaf)) is not None:
            options.append(rng)
        return st.tuples(st.just(leaf), st.one_of(options))

    return st.sampled_from(leaves_).flatmap(for_leaf)


def test_the_walk_finds_the_spec_fields():
    assert {"training.steps", "parallelism.tp", "checkpoint.async_save",
            "parallelism.mixed_precision", "resilience.lease_ttl_s"} <= {
        leaf.path for leaf in SPEC_LEAVES}


@SETTINGS
@given(invalid_values(SPEC_LEAVES))
def test_every_invalid_spec_value_is_refused_naming_its_field(case):
    leaf, value = case
    data = copy.deepcopy(SMALL_JOB)
    set_dotted(data, leaf.path, value)
    with pytest.raises(JobSpecError) as refused:
        parse_job(data)
    fields = [field for field, _ in refused.value.problems]
    assert any(f == leaf.path or f.startswith(f"{leaf.path}.") for f in fields), (
        leaf.path, value, refused.value.problems)
    for _, message in refused.value.problems:
        assert message and "errors.pydantic.dev" not in message


def _valid_value(leaf: Leaf) -> st.SearchStrategy | None:
    """A value inside the field's rule that no cross-field rule of the small job minds."""
    safe = {"training.steps": st.integers(10, 10_000), "training.lr": st.floats(1e-3, 1.0),
            "training.seed": st.integers(0, 2**31), "checkpoint.every_steps": st.integers(1, 500),
            "checkpoint.keep_last": st.integers(1, 20), "checkpoint.async_save": st.booleans(),
            "checkpoint.upload": st.booleans(), "training.log_every": st.integers(1, 100),
            "cluster.dollars_per_gpu_hour": st.floats(0, 100),
            "cluster.inter_node_gbps": st.floats(0.5, 1000),
            "resilience.lease_ttl_s": st.floats(0.5, 3600),
            "resilience.collective_timeout_s": st.floats(1, 10_000),
            "priority": st.sampled_from(["low", "normal", "high", "urgent"]),
            "owner": st.text(min_size=1, max_size=20),
            "cluster.image": st.sampled_from(["fm:1", "1e3", "yes", "0o7", "true", "null"])}
    return safe.get(leaf.path)


VARIED = [leaf for leaf in SPEC_LEAVES if _valid_value(leaf) is not None]


@SETTINGS
@given(st.lists(st.sampled_from(VARIED).flatmap(
    lambda leaf: st.tuples(st.just(leaf.path), _valid_value(leaf))), max_size=6))
def test_every_valid_spec_round_trips_through_its_dump_and_yaml(changes):
    data = copy.deepcopy(SMALL_JOB)
    for path, value in changes:
        set_dotted(data, path, value)
    job = parse_job(data)
    assert parse_job(dump_job(job)) == job
    assert parse_job(load_yaml(dump_yaml(dump_job(job)))) == job


VALID_BODY = {"model": "tiny", "gpus": 2, "data_manifest": "data/0123/manifest.json"}


@SETTINGS
@given(invalid_values(BODY_LEAVES))
def test_every_invalid_body_value_is_refused_naming_its_field(case):
    from pydantic import ValidationError

    leaf, value = case
    body = copy.deepcopy(VALID_BODY)
    set_dotted(body, leaf.path, value)
    with pytest.raises(ValidationError) as refused:
        JobCreate.model_validate(body)
    locs = [".".join(str(p) for p in e["loc"]) for e in refused.value.errors()]
    assert any(loc == leaf.path or loc.startswith(f"{leaf.path}.") for loc in locs), (
        leaf.path, value, locs)


@SETTINGS
@given(st.fixed_dictionaries({}, optional={
    "steps": st.integers(1, 100_000_000), "priority": st.sampled_from(["low", "high"]),
    "checkpoint_every_steps": st.integers(1, 10_000_000),
    "parallelism": st.fixed_dictionaries({"tp": st.integers(1, 1024),
                                          "pp": st.integers(1, 1024)}),
    "global_batch_size": st.integers(1, 100_000_000)}))
def test_every_valid_body_round_trips(extra):
    body = {**VALID_BODY, **extra}
    parsed = JobCreate.model_validate(body)
    assert JobCreate.model_validate(parsed.model_dump()) == parsed
    assert JobCreate.model_validate_json(parsed.model_dump_json()) == parsed
