"""`fm plan`: parallelism, memory, MFU, checkpoint interval, time-to-train and $/token before a
single GPU-hour is spent.

    fm plan estimate --layers 126 --hidden 16384 --heads 128 --kv-heads 8 --ffn 53248 \\
        --vocab 128256 --seq-len 8192 --global-batch-tokens 16777216 --micro-batch 1 \\
        --gpus 16384 --gpu-type h100 --tp 8 --pp 16 --virtual-stages 4 --recompute half --json
    fm plan search --model llama3-405b --seq-len 8192 --global-batch-tokens 16777216 \\
        --gpus 16384 --gpu-type h100
    fm plan whatif --model llama3-405b --seq-len 8192 --global-batch-tokens 16777216 \\
        --gpus 8192 --gpu-type h100 --region-gpus 32768
    fm plan estimate --job configs/demo.yaml --json

`--json` prints one JSON object (estimate: at least mfu, hfu, step_time_s, tokens_per_s,
memory_gib_per_gpu, fits, bubble_fraction, exposed_comm_fraction). Bad input exits 2 with
the flag at fault named.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Annotated

import typer
from rich.console import Console

from fm_pipeline.cli.errors import err_console, user_errors
from fm_pipeline.planner.errors import PlanInputError

app = typer.Typer(help="Plan a training job: layout, memory, MFU, reliability and cost.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()

Job = Annotated[str | None, typer.Option(help="take model, cluster and layout from a job spec")]
Model = Annotated[str | None, typer.Option(help="a named size (llama3-405b, gpt3-175b, ...)")]
Int = Annotated[int | None, typer.Option()]
Float = Annotated[float | None, typer.Option()]
Str = Annotated[str | None, typer.Option()]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object")]


def plan_errors(fn):
    """PlanInputError names its field; print it as the flag to fix, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PlanInputError as e:
            err_console.print(f"[bold red]error:[/] {e.flag}: {e.detail}", highlight=False)
            raise typer.Exit(2) from None

    return user_errors(wrapper)


def _shape(o: dict):
    from fm_pipeline.planner.shape import ModelShape, default_ffn, named_shape

    if o["model"]:
        shape = named_shape(o["model"], seq_len=o["seq_len"])
        overrides = {
            k: o[k]
            for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp")
            if o[k] is not None
        }
        return dataclasses.replace(shape, **overrides) if overrides else shape
    for field in ("layers", "hidden", "heads", "vocab", "seq_len"):
        if o[field] is None:
            raise PlanInputError(field, "is required (or give --model NAME)")
    mlp = o["mlp"] or "swiglu"
    return ModelShape(
        layers=o["layers"],
        hidden=o["hidden"],
        heads=o["heads"],
        kv_heads=o["kv_heads"] or o["heads"],
        ffn=o["ffn"] or default_ffn(o["hidden"], mlp),
        vocab=o["vocab"],
        seq_len=o["seq_len"],
        mlp=mlp,
    )


CLUSTER_FLAGS = (
    "gpus_per_node",
    "intra_node_gbps",
    "inter_node_gbps",
    "oversubscription",
    "nodes_per_rack",
    "region_gpus",
    "inter_region_gbps",
    "storage_write_gbps",
    "dollars_per_gpu_hour",
    "node_failure_rate_per_day",
)


def _cluster(o: dict):
    from fm_pipeline.planner.cluster import make_cluster

    if not o["gpu_type"]:
        raise PlanInputError(
            "gpu_type", "is required (a100-40gb, a100-80gb, h100, h200, b200, cpu)"
        )
    return make_cluster(o["gpu_type"], **{k: o[k] for k in CLUSTER_FLAGS})


def _layout(o: dict, gpus: int):
    from fm_pipeline.planner.layout import Layout

    for field in ("tp", "pp", "micro_batch"):
        if o[field] is None:
            raise PlanInputError(field, "is required for an estimate (fm plan search finds one)")
    tp, pp, cp = o["tp"], o["pp"], o["cp"] or 1
    dp = o["dp"]
    if dp is None:
        for field, degree in (("tp", tp), ("pp", pp), ("cp", cp)):
            if gpus % degree:
                raise PlanInputError(field, f"{degree} does not divide the {gpus} GPUs")
        if gpus % (tp * pp * cp):
            raise PlanInputError(
                "gpus", f"{gpus} GPUs do not divide by tp x pp x cp = {tp * pp * cp}"
            )
        dp = gpus // (tp * pp * cp)
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        micro_batch=o["micro_batch"],
        virtual_stages=o["virtual_stages"] or 1,
        recompute=o["recompute"] or "none",
        sharding=o["sharding"] or "zero1",
    )


def _inputs(o: dict) -> dict:
    """Everything a command needs, from --job or from the flags."""
    if o["job"]:
        from fm_pipeline.config import load_job
        from fm_pipeline.planner.job_plan import job_inputs

        inp = job_inputs(load_job(o["job"]))
        inp["gpus"] = inp["layout"].gpus
        return inp
    shape = _shape(o)
    cluster = _cluster(o)
    if o["gpus"] is None:
        raise PlanInputError("gpus", "is required")
    if o["global_batch_tokens"] is None:
        raise PlanInputError("global_batch_tokens", "is required (tokens per optimizer step)")
    return {
        "shape": shape,
        "cluster": cluster,
        "gpus": o["gpus"],
        "global_batch_tokens": o["global_batch_tokens"],
        "training_tokens": o["training_tokens"],
        "precision": o["precision"] or "bf16",
    }


def _print(payload, view, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload))
    else:
        console.print(view)


@app.command()
@plan_errors
def estimate(
    job: Job = None,
    model: Model = None,
    layers: Int = None,
    hidden: Int = None,
    heads: Int = None,
    kv_heads: Int = None,
    ffn: Int = None,
    vocab: Int = None,
    seq_len: Int = None,
    mlp: Annotated[str | None, typer.Option(help="swiglu (Llama) or gelu (GPT)")] = None,
    global_batch_tokens: Int = None,
    training_tokens: Float = None,
    micro_batch: Int = None,
    gpus: Int = None,
    gpu_type: Str = None,
    gpus_per_node: Int = None,
    tp: Int = None,
    pp: Int = None,
    dp: Int = None,
    cp: Int = None,
    virtual_stages: Int = None,
    recompute: Annotated[str | None, typer.Option(help="none|selective|half|full")] = None,
    sharding: Annotated[str | None, typer.Option(help="ddp|zero1|zero2|fsdp")] = None,
    precision: Annotated[str | None, typer.Option(help="bf16|fp32")] = None,
    intra_node_gbps: Float = None,
    inter_node_gbps: Float = None,
    oversubscription: Float = None,
    nodes_per_rack: Int = None,
    region_gpus: Int = None,
    inter_region_gbps: Float = None,
    storage_write_gbps: Float = None,
    dollars_per_gpu_hour: Float = None,
    node_failure_rate_per_day: Float = None,
    as_json: Json = False,
):
    """Predict one layout: memory, step time, MFU/HFU, checkpoint interval, time and cost."""
    from fm_pipeline.planner.estimate import estimate as run_estimate
    from fm_pipeline.planner.tables import estimate_view

    o = locals()
    inp = _inputs(o)
    layout = inp.get("layout") or _layout(o, inp["gpus"])
    if layout.gpus != inp["gpus"]:
        raise PlanInputError(
            "dp",
            f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} x cp {layout.cp}"
            f" = {layout.gpus} must equal gpus ({inp['gpus']})",
        )
    est = run_estimate(
        inp["shape"],
        inp["cluster"],
        layout,
        global_batch_tokens=inp["global_batch_tokens"],
        training_tokens=inp["training_tokens"],
        precision=inp["precision"],
        async_checkpoint=inp.get("async_checkpoint", True),
        checkpoints_kept=inp.get("checkpoints_kept", 3),
    )
    _print(est.to_dict(), estimate_view(est), as_json)


@app.command()
@plan_errors
def search(
    job: Job = None,
    model: Model = None,
    layers: Int = None,
    hidden: Int = None,
    heads: Int = None,
    kv_heads: Int = None,
    ffn: Int = None,
    vocab: Int = None,
    seq_len: Int = None,
    mlp: Str = None,
    global_batch_tokens: Int = None,
    training_tokens: Float = None,
    gpus: Int = None,
    gpu_type: Str = None,
    gpus_per_node: Int = None,
    micro_batch: Annotated[int | None, typer.Option(help="pin the micro-batch size")] = None,
    tp: Annotated[int | None, typer.Option(help="pin tp")] = None,
    pp: Annotated[int | None, typer.Option(help="pin pp")] = None,
    cp: Annotated[int | None, typer.Option(help="pin cp")] = None,
    recompute: Annotated[str | None, typer.Option(help="pin: none|selective|half|full")] = None,
    sharding: Annotated[str | None, typer.Option(help="pin: ddp|zero1|zero2|fsdp")] = None,
    precision: Str = None,
    top: Annotated[int, typer.Option(help="plans to show")] = 5,
    intra_node_gbps: Float = None,
    inter_node_gbps: Float = None,
    oversubscription: Float = None,
    nodes_per_rack: Int = None,
    region_gpus: Int = None,
    inter_region_gbps: Float = None,
    storage_write_gbps: Float = None,
    dollars_per_gpu_hour: Float = None,
    node_failure_rate_per_day: Float = None,
    as_json: Json = False,
):
    """Enumerate valid layouts, drop what does not fit, rank by predicted throughput."""
    from fm_pipeline.planner.search import search as run_search
    from fm_pipeline.planner.tables import search_view

    o = locals()
    inp = _inputs(o)
    fixed = {
        k: o[k]
        for k in ("tp", "pp", "cp", "micro_batch", "recompute", "sharding")
        if o[k] is not None
    }
    result = run_search(
        inp["shape"],
        inp["cluster"],
        gpus=inp["gpus"],
        global_batch_tokens=inp["global_batch_tokens"],
        top=top,
        fixed=fixed,
        precision=inp["precision"],
    )
    payload = {
        "evaluated": result.evaluated,
        "fitting": result.fitting,
        "search_s": result.seconds,
        "gpus": result.gpus,
        "plans": [
            {
                "rank": p.rank,
                "layout": dataclasses.asdict(p.layout),
                "describe": p.layout.describe(),
                **{k: v for k, v in result.metrics(p.index).items() if not isinstance(v, dict)},
                "reasons": p.reasons,
            }
            for p in result.plans
        ],
    }
    _print(payload, search_view(result), as_json)
    if not result.plans:
        raise typer.Exit(1)


@app.command()
@plan_errors
def whatif(
    job: Job = None,
    model: Model = None,
    layers: Int = None,
    hidden: Int = None,
    heads: Int = None,
    kv_heads: Int = None,
    ffn: Int = None,
    vocab: Int = None,
    seq_len: Int = None,
    mlp: Str = None,
    global_batch_tokens: Int = None,
    training_tokens: Float = None,
    gpus: Int = None,
    gpu_type: Str = None,
    gpus_per_node: Int = None,
    micro_batch: Int = None,
    tp: Annotated[int | None, typer.Option(help="with --pp: start from this layout")] = None,
    pp: Int = None,
    dp: Int = None,
    cp: Int = None,
    virtual_stages: Int = None,
    recompute: Str = None,
    sharding: Str = None,
    precision: Str = None,
    doublings: Annotated[int, typer.Option(help="GPU doublings to try (2x, 4x, ...)")] = 2,
    intra_node_gbps: Float = None,
    inter_node_gbps: Float = None,
    oversubscription: Float = None,
    nodes_per_rack: Int = None,
    region_gpus: Int = None,
    inter_region_gbps: Float = None,
    storage_write_gbps: Float = None,
    dollars_per_gpu_hour: Float = None,
    node_failure_rate_per_day: Float = None,
    as_json: Json = False,
):
    """Sweep GPU count (x2), fabric and storage bandwidth, failure rate: what breaks first."""
    from fm_pipeline.planner.tables import whatif_view
    from fm_pipeline.planner.whatif import what_if

    o = locals()
    inp = _inputs(o)
    layout = inp.get("layout")
    if layout is None and tp is not None and pp is not None:
        layout = _layout({**o, "micro_batch": micro_batch or 1}, inp["gpus"])
    wi = what_if(
        inp["shape"],
        inp["cluster"],
        gpus=inp["gpus"],
        global_batch_tokens=inp["global_batch_tokens"],
        training_tokens=inp["training_tokens"],
        layout=layout,
        doublings=doublings,
        precision=inp["precision"],
    )
    _print(wi.to_dict(), whatif_view(wi), as_json)


if __name__ == "__main__":
    app()
