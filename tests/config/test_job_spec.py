"""A job spec is parsed once; every invalid field is named with the rule it breaks."""

from __future__ import annotations

import pytest
import yaml

from fm_pipeline.config import JobSpecError, dump_job, load_job, parse_job
from tests.conftest import REPO

DEMO = REPO / "configs" / "demo.yaml"


@pytest.fixture
def demo() -> dict:
    return yaml.safe_load(DEMO.read_text())


def problems(data: dict) -> dict[str, str]:
    with pytest.raises(JobSpecError) as e:
        parse_job(data)
    return dict(e.value.problems)


def test_demo_config_parses():
    job = load_job(DEMO)
    assert job.parallelism.world_size == 2
    assert job.parallelism.dp_shard == 2
    assert job.model_cfg.vocab_size == 2048
    assert job.tokens_per_step == 16 * 128


def test_dp_shard_is_inferred_from_world_size_and_the_declared_minus_one_round_trips(demo):
    demo["parallelism"] = {"nproc_per_node": 4, "tp": 2}
    job = parse_job(demo)
    assert job.parallelism.resolved_dp_shard == 2 and job.parallelism.dp == 2
    # The spec says what was declared: a dumped spec (a launcher's job.yaml) keeps -1, so
    # a segment on another world size can still let dp_shard follow it.
    assert dump_job(job)["parallelism"]["dp_shard"] == -1
    assert parse_job(dump_job(job)) == job


def test_degrees_must_multiply_to_world_size_and_message_prints_every_degree(demo):
    demo["parallelism"] = {"nproc_per_node": 4, "dp_shard": 1, "tp": 2, "pp": 1}
    msg = problems(demo)["parallelism"]
    for part in ("dp_replicate 1", "dp_shard 1", "tp 2", "pp 1", "world size 4"):
        assert part in msg


def test_heads_must_divide_by_tp(demo):
    demo["parallelism"] = {"nproc_per_node": 4, "tp": 4, "dp_shard": 1}
    assert "n_kv_heads (2) must be divisible by tp (4)" in problems(demo)["parallelism.tp"]


def test_layers_must_divide_by_pipeline_stages(demo):
    demo["model"]["n_layers"] = 3
    demo["parallelism"] = {"nproc_per_node": 2, "pp": 2, "dp_shard": 1}
    demo["training"].update(global_batch_size=16, micro_batch_size=4)
    assert "n_layers (3)" in problems(demo)["parallelism.pp"]


def test_weights_must_sum_to_one(demo):
    demo["data"]["sources"][0]["weight"] = 0.5
    assert "must sum to 1, got 0.9" in problems(demo)["data"]


def test_unknown_field_is_named(demo):
    demo["training"]["stpes"] = 10
    assert "training.stpes" in problems(demo)


def test_batch_must_divide_by_dp(demo):
    demo["training"]["global_batch_size"] = 15
    assert "divisible by dp" in problems(demo)["training.global_batch_size"]


def test_several_cross_field_problems_are_reported_together(demo):
    demo["parallelism"] = {"nproc_per_node": 4, "tp": 4, "dp_shard": 1}
    demo["training"].update(global_batch_size=12, seq_len=130)
    found = problems(demo)
    assert "parallelism.tp" in found and "training.seq_len" in found


def test_name_must_be_a_kubernetes_name(demo):
    demo["name"] = "My_Job"
    assert "lowercase" in problems(demo)["name"]


def test_bad_yaml_and_missing_file_are_clear(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(JobSpecError, match=r"\(yaml\)"):
        load_job(bad)
    with pytest.raises(JobSpecError, match="no such file"):
        load_job(tmp_path / "absent.yaml")


def test_overrides_apply_before_validation():
    job = load_job(DEMO, **{"training.steps": 40, "parallelism.nproc_per_node": 1,
                            "parallelism.dp_shard": -1})
    assert job.training.steps == 40 and job.parallelism.resolved_dp_shard == 1


def _spec_file(tmp_path, text: str):
    path = tmp_path / "job.yaml"
    path.write_text(DEMO.read_text() + text)
    return path


def test_a_repeated_yaml_key_is_refused_with_both_lines(tmp_path):
    path = _spec_file(tmp_path, "name: other\n")
    with pytest.raises(JobSpecError) as e:
        load_job(path)
    field, message = e.value.problems[0]
    assert field == "(yaml)" and "duplicate key 'name' (first at line" in message


@pytest.mark.parametrize("change, field, words", [
    ({"training": {"steps": True}}, "training.steps", "valid integer (got a boolean)"),
    ({"training": {"steps": "40"}}, "training.steps", "valid integer (got a string)"),
    ({"checkpoint": {"async_save": 1}}, "checkpoint.async_save", "valid boolean (got an integer)"),
    ({"training": {"lr": float("nan")}}, "training.lr", "finite number"),
    ({"cluster": {"inter_node_gbps": float("inf")}}, "cluster.inter_node_gbps", "finite number"),
    ({"model": {"size": "tiny", "n_heads": 3}}, "model",
     "must be divisible by n_heads (3)"),
])
def test_values_are_never_coerced_and_every_error_keeps_its_reason(demo, change, field, words):
    for section, values in change.items():
        demo[section] = {**(demo.get(section) or {}), **values}
    found = problems(demo)
    assert words in found.get(field, ""), found
    assert all("errors.pydantic.dev" not in m for m in found.values())


def test_yaml_1_2_scalars_in_a_spec_file(tmp_path):
    """`1e-3` is a number (YAML 1.1 would leave it a string); `yes` is no boolean."""
    path = tmp_path / "job.yaml"
    path.write_text(DEMO.read_text().replace("  segment_steps: 20", "  segment_steps: 20\n"
                                             "  lr: 1e-3\n  min_lr: 1e-4"))
    assert load_job(path).training.lr == 1e-3
    path.write_text(DEMO.read_text().replace("  keep_last: 3", "  keep_last: 3\n"
                                             "  async_save: yes"))
    with pytest.raises(JobSpecError) as e:
        load_job(path)
    assert "valid boolean (got a string)" in dict(e.value.problems)["checkpoint.async_save"]


def test_mixed_precision_defaults_to_bf16_on_gpus_and_fp32_on_cpu(demo):
    assert parse_job(demo).parallelism.mixed_precision == "fp32"  # cluster.accelerator: cpu
    on_gpus = parse_job({**demo, "cluster": {"accelerator": "h100"}})
    assert on_gpus.parallelism.mixed_precision == "bf16"
    assert parse_job(dump_job(on_gpus)) == on_gpus
    declared = {**demo, "cluster": {"accelerator": "h100"},
                "parallelism": {**demo["parallelism"], "mixed_precision": "fp32"}}
    assert parse_job(declared).parallelism.mixed_precision == "fp32"


def test_a_name_with_a_trailing_newline_is_refused(demo):
    # `$` matches before a final newline: the rule must hold for the whole name, or
    # "adv-t1\n" writes runs/adv-t1\n and is listed as adv-t1.
    demo["name"] = "adv-t1\n"
    assert "Kubernetes object name" in problems(demo)["name"]


@pytest.mark.parametrize("field, value, bound", [
    ("training.seed", 2**70, "4294967295"),
    ("training.seed", -1, "0"),
    ("training.steps", 10**40, "1000000000"),
    ("model.vocab_size", 10**12, "4294967296"),
    ("data.seed", 2**64, "4294967295"),
    ("parallelism.nproc_per_node", 2**40, "1024"),
])
def test_integers_past_what_torch_or_the_shards_hold_are_refused_naming_the_field(
        demo, field, value, bound):
    section, key = field.split(".")
    demo.setdefault(section, {})[key] = value
    found = problems(demo)
    assert field in found, found
    assert bound in found[field]


def test_the_largest_registry_models_stay_within_the_bounds(demo):
    from fm_pipeline.model.registry import model_names

    for size in model_names():
        demo["model"] = {"size": size}
        demo["training"].update(seq_len=128)
        demo["parallelism"] = {"nproc_per_node": 2}
        try:
            parse_job(demo)
        except JobSpecError as e:  # other rules (tied embeddings, ...) may apply; no bound
            assert not any("less than or equal" in m or f == "model.size"
                           for f, m in e.problems), e.problems
