"""`fm plan`: the command-line contract other tools rely on."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fm_pipeline.cli.plan import app
from tests.conftest import REPO

runner = CliRunner()

LLAMA_405B = ["--layers", "126", "--hidden", "16384", "--heads", "128", "--kv-heads", "8",
              "--ffn", "53248", "--vocab", "128256", "--seq-len", "8192"]
CONTRACT_KEYS = {"mfu", "hfu", "step_time_s", "tokens_per_s", "memory_gib_per_gpu", "fits",
                 "bubble_fraction", "exposed_comm_fraction"}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_estimate_json_prints_one_object_with_the_contract_keys():
    r = invoke("estimate", *LLAMA_405B, "--global-batch-tokens", 16 * 2**20, "--micro-batch", 1,
               "--gpus", 16384, "--gpu-type", "h100", "--gpus-per-node", 8, "--tp", 8, "--pp", 16,
               "--virtual-stages", 4, "--recompute", "full", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert CONTRACT_KEYS <= out.keys()
    assert out["fits"] is True and out["layout"]["dp"] == 128  # dp inferred from the GPUs
    assert 0.2 < out["mfu"] < 0.6 and out["hfu"] > out["mfu"]
    assert out["bubble_fraction"] + out["exposed_comm_fraction"] < 1


def test_estimate_without_json_prints_tables():
    r = invoke(
        "estimate",
        "--model",
        "llama3-8b",
        "--seq-len",
        8192,
        "--global-batch-tokens",
        8 * 8192,
        "--micro-batch",
        1,
        "--gpus",
        8,
        "--gpu-type",
        "a100-80gb",
        "--tp",
        1,
        "--pp",
        1,
    )
    assert r.exit_code == 0, r.output
    assert (
        "MFU / HFU" in r.stdout and "checkpoint every" in r.stdout and "rank placement" in r.stdout
    )


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--tp", 3, "--pp", 1], "--tp"),
        (["--tp", 8, "--pp", 16, "--dp", 7], "--dp"),
        (["--tp", 8, "--pp", 16, "--gpu-type", "tpu-v9"], "--gpu-type"),
    ],
)
def test_invalid_estimates_exit_2_naming_the_flag(args, flag):
    base = [*LLAMA_405B, "--global-batch-tokens", 16 * 2**20, "--micro-batch", 1, "--gpus", 16384]
    if "--gpu-type" not in args:
        base += ["--gpu-type", "h100"]
    r = invoke("estimate", *base, *args, "--json")
    assert r.exit_code == 2
    assert f"error: {flag}:" in r.stderr


def test_missing_shape_flags_are_named():
    r = invoke(
        "estimate",
        "--hidden",
        4096,
        "--heads",
        32,
        "--vocab",
        32000,
        "--seq-len",
        4096,
        "--global-batch-tokens",
        4096,
        "--micro-batch",
        1,
        "--gpus",
        1,
        "--gpu-type",
        "h100",
        "--tp",
        1,
        "--pp",
        1,
    )
    assert r.exit_code == 2 and "error: --layers: is required (or give --model NAME)" in r.stderr


def test_search_json_ranks_plans_with_reasons():
    r = invoke(
        "search",
        "--model",
        "llama3-70b",
        "--seq-len",
        8192,
        "--global-batch-tokens",
        4 * 2**20,
        "--gpus",
        512,
        "--gpu-type",
        "h100",
        "--top",
        3,
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["evaluated"] >= out["fitting"] > 0 and len(out["plans"]) == 3
    tput = [p["tokens_per_s"] for p in out["plans"]]
    assert tput == sorted(tput, reverse=True)
    assert all(p["fits"] and p["reasons"] for p in out["plans"])


def test_whatif_json_reports_what_breaks_first():
    r = invoke(
        "whatif",
        "--model",
        "llama3-70b",
        "--seq-len",
        8192,
        "--global-batch-tokens",
        4 * 2**20,
        "--gpus",
        256,
        "--gpu-type",
        "h100",
        "--tp",
        8,
        "--pp",
        4,
        "--virtual-stages",
        2,
        "--doublings",
        1,
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [s["scenario"] for s in out["scenarios"]][:3] == [
        "baseline",
        "2x GPUs, dp x2",
        "2x GPUs, re-planned",
    ]
    assert out["breaks_first"]


def test_estimate_from_a_job_spec():
    r = invoke("estimate", "--job", REPO / "configs" / "demo.yaml", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["fits"] and out["gpus"] == 2 and out["gpu_type"].startswith("cpu")


def test_a_published_megatron_2021_run_is_written_with_its_settings_on_the_command_line():
    """Narayanan et al. 2021, Table 1's 1T row (tp 8, pp 64, 3,072 A100s, batch 3,072): no
    sequence parallelism, no overlap of TP or DP traffic, 200 Gb/s HDR per GPU. The command
    line carries every one of them, and gives what the calibration's own call gives."""
    from fm_pipeline.planner.cluster import make_cluster
    from fm_pipeline.planner.estimate import estimate
    from fm_pipeline.planner.layout import Layout
    from fm_pipeline.planner.literature import A100_HDR
    from fm_pipeline.planner.shape import named_shape

    run = ["estimate", "--model", "megatron-1t", "--seq-len", 2048, "--gpus", 3072,
           "--gpu-type", "a100-80gb", "--global-batch-tokens", 3072 * 2048, "--tp", 8,
           "--pp", 64, "--micro-batch", 1, "--recompute", "full", "--sharding", "ddp",
           "--inter-node-gbps", A100_HDR, "--json"]
    published = ["--no-sequence-parallel", "--no-tp-overlap", "--no-dp-overlap"]
    as_2021 = json.loads(invoke(*run, *published).stdout)
    defaults = json.loads(invoke(*run).stdout)
    assert as_2021["cost_model"] == {"ep_overlap": "none", "sequence_parallel": False,
                                     "tp_overlap": False, "dp_overlap": False}
    assert defaults["cost_model"]["sequence_parallel"] is True
    direct = estimate(named_shape("megatron-1t", seq_len=2048),
                      make_cluster("a100-80gb", inter_node_gbps=A100_HDR),
                      Layout(tp=8, pp=64, dp=6, micro_batch=1, recompute="full",
                             sharding="ddp"),
                      global_batch_tokens=3072 * 2048, sequence_parallel=False,
                      tp_overlap=False, dp_overlap=False)
    assert as_2021["step_time_s"] == pytest.approx(direct.metrics["step_time_s"])
    assert as_2021["step_time_s"] > defaults["step_time_s"]  # 2021's Megatron was slower
    searched = json.loads(invoke("search", *run[1:13], *published, "--top", 1, "--json").stdout)
    assert searched["cost_model"]["tp_overlap"] is False
