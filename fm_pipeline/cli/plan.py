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
    fm plan defaults --gpu-type h100           # what a left-out cluster field means, and why

`--json` prints one JSON object (estimate: at least mfu, hfu, step_time_s, tokens_per_s,
memory_gib_per_gpu, fits, bubble_fraction, exposed_comm_fraction). Bad input exits 2 with
the flag at fault named.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
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
            for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp",
                      "expert_imbalance", "route_nodes", "qk_head_dim", "v_head_dim")
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
    "fabric",
    "leaf_ports",
    "ecmp_efficiency",
    "region_gpus",
    "inter_region_gbps",
    "storage_write_gbps",
    "storage_read_gbps",
    "dollars_per_gpu_hour",
    "node_failure_rate_per_day",
    "checkpoint_store_share",
)


def _cluster(o: dict):
    from fm_pipeline.planner.cluster import make_cluster

    if not o["gpu_type"]:
        raise PlanInputError(
            "gpu_type", "is required (a100-40gb, a100-80gb, h100, h100-96gb, h800, h200, b200, cpu)"
        )
    return make_cluster(o["gpu_type"], **{k: o[k] for k in CLUSTER_FLAGS})


def _layout(o: dict, gpus: int):
    from fm_pipeline.planner.layout import Layout, parse_layout

    if o.get("layout"):
        return parse_layout(o["layout"])
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
    sharding, _, group = (o["sharding"] or "fsdp").partition("/")
    if group and not group.isdigit():
        raise PlanInputError("sharding", f"hybrid sharding is fsdp/N, got {o['sharding']!r}")
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        micro_batch=o["micro_batch"],
        virtual_stages=o["virtual_stages"] or 1,
        recompute=o["recompute"] or "none",
        sharding=sharding,
        dp_shard=int(group) if group else 0,
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
        # As the job spec: bf16 on GPUs, fp32 on CPU (where bf16 matmuls are no faster).
        "precision": o["precision"] or ("fp32" if o["gpu_type"].lower() == "cpu" else "bf16"),
    }


def _knobs(o: dict) -> dict:
    """The cost model's settings from the command line, passed the same to every call."""
    return {"ep_overlap": o["ep_overlap"] or "none", "sequence_parallel": o["sequence_parallel"],
            "tp_overlap": o["tp_overlap"], "dp_overlap": o["dp_overlap"]}


def _print(payload, view, as_json: bool) -> None:
    if as_json:
        print(json.dumps(payload))
    else:
        console.print(view)


# Options every command takes: the model, the batch, the cluster, --json.
SHARED_OPTIONS: dict[str, object] = {
    "job": Job, "model": Model, "layers": Int, "hidden": Int, "heads": Int, "kv_heads": Int,
    "ffn": Int, "vocab": Int, "seq_len": Int,
    "mlp": Annotated[str | None, typer.Option(help="swiglu (Llama) or gelu (GPT)")],
    "expert_imbalance": Annotated[float | None, typer.Option(
        help="MoE: busiest ep rank's routed tokens / the mean (default 1.1, assumed; the "
             "trainer's router stats measure it)")],
    "route_nodes": Annotated[int | None, typer.Option(
        help="MoE, planner only: node-limited routing (DeepSeek-V3: 4), a token sent once "
             "per node it reaches (DeepEP); default unlimited, every copy sent")],
    "qk_head_dim": Annotated[int | None, typer.Option(
        help="planner only: query/key head width when not hidden / heads (DeepSeek-V3's "
             "latent attention: 192 = 128 + 64 rotary)")],
    "v_head_dim": Annotated[int | None, typer.Option(
        help="planner only: value head width when not hidden / heads (DeepSeek-V3: 128)")],
    "ep_overlap": Annotated[str | None, typer.Option(
        help="MoE, planner only: the all-to-all's overlap with compute: none (default; "
             "torchtitan, this trainer), 1f1b (Megatron-Core's, the share it hides fitted on "
             "its published runs), dualpipe (DeepSeek-V3's: all of it)")],
    # What a published run says it used, so it can be written on the command line: the
    # calibration sets the same three per source (planner/literature.py).
    "sequence_parallel": (Annotated[bool, typer.Option(
        "--sequence-parallel/--no-sequence-parallel",
        help="TP with sequence parallelism (Megatron since 2022, torchtitan; default). "
             "--no-sequence-parallel: all-reduces of the same bytes, norms and dropout "
             "unsplit (Megatron 2021)")], True),
    "tp_overlap": (Annotated[bool, typer.Option(
        "--tp-overlap/--no-tp-overlap",
        help="TP's collectives overlapped with its GEMMs (needs sequence parallelism; "
             "default)")], True),
    "dp_overlap": (Annotated[bool, typer.Option(
        "--dp-overlap/--no-dp-overlap",
        help="data-parallel gradient sync and weight gathers overlapped with compute "
             "(default)")], True),
    "global_batch_tokens": Int, "training_tokens": Float, "gpus": Int, "gpu_type": Str,
    "gpus_per_node": Int, "precision": Annotated[str | None, typer.Option(
        help="bf16 | fp32 | fp8 (= fp8-tensorwise) | fp8-rowwise | fp8-blockwise; FP8 runs "
             "the blocks' linear layers in FP8 (H100, H200, B200), MFU against bf16's peak")],
    **{flag: Float if flag.endswith(("gbps", "subscription", "hour", "per_day", "share",
                                     "efficiency")) else Int
       for flag in CLUSTER_FLAGS if flag not in ("gpus_per_node", "fabric")},
    "fabric": Annotated[str | None, typer.Option(
        help="rail (default: NIC k of every node on leaf k, as DGX SuperPOD) or tor (every NIC "
             "of a node on its rack's switch, spine flows hashed: ECMP)")],
    "as_json": Json,
}


def plan_command(**own: object):
    """Register `fn(o)` as a command taking the shared options plus its `own` (name ->
    annotated type, default None unless the annotation is a (type, default) pair); `o` is
    every option by name."""

    def decorate(fn):
        params, annotations = [], {}
        for name, spec in {**SHARED_OPTIONS, **own}.items():
            annotation, default = spec if isinstance(spec, tuple) else (spec, None)
            if name == "as_json":
                default = False
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                            default=default, annotation=annotation))
            annotations[name] = annotation

        @functools.wraps(fn)
        def command(**o):
            return fn(o)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = annotations
        return app.command(name=fn.__name__)(plan_errors(command))

    return decorate


RECOMPUTE_HELP = "none|norm_act|op|selective|half|full (op: the trainer's selective)"
SHARDING_HELP = "fsdp (default), fsdp/N (hybrid: shard in N, replicate across), ddp, zero1, zero2"


@plan_command(
    micro_batch=Int, tp=Int, pp=Int, dp=Int, cp=Int, virtual_stages=Int,
    recompute=Annotated[str | None, typer.Option(help=RECOMPUTE_HELP)],
    sharding=Annotated[str | None, typer.Option(help=SHARDING_HELP)],
    layout=Annotated[str | None, typer.Option(
        help="a layout as `fm plan search` prints it: \"tp=8 pp=16 dp=16 mb=1 fsdp/64\"")])
def estimate(o: dict):
    """Predict one layout: memory, step time, MFU/HFU, checkpoint interval, time and cost."""
    from fm_pipeline.planner.estimate import estimate as run_estimate
    from fm_pipeline.planner.tables import estimate_view

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
        **_knobs(o),
    )
    payload = {**est.to_dict(), "cost_model": _knobs(o)}
    if o["job"]:  # what the spec declares, argued with the plan's numbers
        from fm_pipeline.config import load_job
        from fm_pipeline.planner.critique import critique

        payload["critique"] = [f.to_dict() for f in critique(load_job(o["job"]), inp, est)]
    _print(payload, estimate_view(est), o["as_json"])
    if o["job"] and not o["as_json"]:
        for f in payload["critique"]:
            console.print(f"[yellow]critique:[/] {f['field']}: {f['message']} (suggested: "
                          f"{f['suggested']})", highlight=False)


@plan_command(
    micro_batch=Annotated[int | None, typer.Option(help="pin the micro-batch size")],
    tp=Annotated[int | None, typer.Option(help="pin tp")],
    pp=Annotated[int | None, typer.Option(help="pin pp")],
    cp=Annotated[int | None, typer.Option(help="pin cp")],
    ep=Annotated[int | None, typer.Option(help="pin ep (Mixture of Experts)")],
    recompute=Annotated[str | None, typer.Option(
        help=f"pin: {RECOMPUTE_HELP}")],
    sharding=Annotated[str | None, typer.Option(help="pin: ddp|zero1|zero2|fsdp")],
    top=(Annotated[int, typer.Option(help="plans to show")], 5),
    any_layout=(Annotated[bool, typer.Option(
        "--any-layout", help="rank every layout the cost model knows, runnable or not")], False),
    write_spec=Annotated[str | None, typer.Option(
        help="write the job spec of plan --spec-rank to this YAML file")],
    spec_rank=(Annotated[int, typer.Option(help="which plan --write-spec writes")], 1),
    name=Annotated[str | None, typer.Option(help="the written job's name")])
def search(o: dict):
    """Enumerate valid layouts the trainer can run, drop what does not fit, rank by predicted
    throughput; faster layouts it cannot run are listed apart with the reason."""
    from fm_pipeline.planner.search import search as run_search
    from fm_pipeline.planner.tables import search_view

    inp = _inputs(o)
    fixed = {
        k: o[k]
        for k in ("tp", "pp", "cp", "ep", "micro_batch", "recompute", "sharding")
        if o[k] is not None
    }
    result = run_search(
        inp["shape"],
        inp["cluster"],
        gpus=inp["gpus"],
        global_batch_tokens=inp["global_batch_tokens"],
        top=o["top"],
        fixed=fixed,
        precision=inp["precision"],
        runnable_only=not o["any_layout"],
        **_knobs(o),
    )
    payload = {
        "evaluated": result.evaluated,
        "fitting": result.fitting,
        "search_s": result.seconds,
        "gpus": result.gpus,
        "precision": inp["precision"],
        "cost_model": _knobs(o),
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
        "not_runnable_here": [
            {
                "describe": p.layout.describe(),
                **{k: v for k, v in result.metrics(p.index).items() if not isinstance(v, dict)},
                "why_not": p.reasons,
            }
            for p in result.not_runnable
        ],
    }
    if o["write_spec"]:
        payload["spec_written"] = _write_spec(o, inp, result)
    _print(payload, search_view(result), o["as_json"])
    if not result.plans:
        raise typer.Exit(1)


def _write_spec(o: dict, inp: dict, result) -> str:
    """The job spec of plan --spec-rank, checked by the spec loader before it is written."""
    import math
    from pathlib import Path

    from fm_pipeline.config.load import parse_job
    from fm_pipeline.config.strict_yaml import dump_yaml, load_yaml
    from fm_pipeline.defaults import DEMO_JOB
    from fm_pipeline.planner.estimate import estimate as run_estimate
    from fm_pipeline.planner.plan_spec import job_name, spec_sections

    if not 1 <= o["spec_rank"] <= len(result.plans):
        raise PlanInputError("spec_rank", f"{o['spec_rank']} is not one of the "
                             f"{len(result.plans)} plans found")
    layout = result.plans[o["spec_rank"] - 1].layout
    est = run_estimate(inp["shape"], inp["cluster"], layout,
                       global_batch_tokens=inp["global_batch_tokens"],
                       training_tokens=inp["training_tokens"], precision=inp["precision"],
                       **_knobs(o))
    # The two-level plan where the fast tier gains goodput (more than one node: a peer
    # holds the replicas), else the durable interval alone.
    fast = est.fast_tier
    two_level = bool(fast and fast.fast_interval_steps and math.isfinite(fast.goodput)
                     and fast.goodput > fast.goodput_durable_only)
    spec = {"name": o["name"] or job_name(inp["shape"], layout),
            **spec_sections(inp["shape"], inp["cluster"], layout,
                            global_batch_tokens=inp["global_batch_tokens"],
                            precision=result.precision,  # canonical: fp8 -> fp8-tensorwise
                            checkpoint_every_steps=fast.durable_interval_steps if two_level
                            else est.reliability.interval_steps,
                            memory_every_steps=fast.fast_interval_steps if two_level else 0,
                            training_steps=est.cost.steps, estimate=est)}
    # The data mix is not the planner's: the embedded demo's sources stand in, named as such.
    spec["data"] = load_yaml(DEMO_JOB.read_text(), source=str(DEMO_JOB))["data"]
    parse_job(spec, source="the written plan")  # refuses (naming fields) before writing
    path = Path(o["write_spec"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# Plan {o['spec_rank']} of `fm plan search`: {layout.describe()} on {layout.gpus} x "
        f"{inp['cluster'].accelerator.name}\n"
        "# data: the embedded demo's sources stand in; replace them with the real mix.\n"
        + dump_yaml(spec))
    return str(path)


@plan_command(
    micro_batch=Int,
    tp=Annotated[int | None, typer.Option(help="with --pp: start from this layout")],
    pp=Int, dp=Int, cp=Int, virtual_stages=Int, recompute=Str, sharding=Str,
    doublings=(Annotated[int, typer.Option(help="GPU doublings to try (2x, 4x, ...)")], 2))
def whatif(o: dict):
    """Sweep GPU count (x2), fabric and storage bandwidth, failure rate: what breaks first."""
    from fm_pipeline.planner.tables import whatif_view
    from fm_pipeline.planner.whatif import what_if

    inp = _inputs(o)
    layout = inp.get("layout")
    if layout is None and o["tp"] is not None and o["pp"] is not None:
        layout = _layout({**o, "micro_batch": o["micro_batch"] or 1}, inp["gpus"])
    wi = what_if(
        inp["shape"],
        inp["cluster"],
        gpus=inp["gpus"],
        global_batch_tokens=inp["global_batch_tokens"],
        training_tokens=inp["training_tokens"],
        layout=layout,
        doublings=o["doublings"],
        precision=inp["precision"],
        **_knobs(o),
    )
    _print(wi.to_dict(), whatif_view(wi), o["as_json"])


@app.command("defaults")
@plan_errors
def defaults(gpu_type: Annotated[str, typer.Option(help="the accelerator")] = "h100",
             as_json: Json = False) -> None:
    """The cluster a plan assumes for what a flag or a job spec leaves out, each default
    with its source (one table: the job spec's `cluster:` section and the API use it too)."""
    from rich.table import Table

    from fm_pipeline.planner.cluster import cluster_defaults

    rows = cluster_defaults(gpu_type)
    if as_json:
        print(json.dumps({"gpu_type": gpu_type, "defaults": rows}))
        return
    table = Table(title=f"cluster defaults on {gpu_type} (fm_pipeline/cluster_defaults.py)")
    for column in ("field", "default", "from"):
        table.add_column(column)
    for r in rows:
        source = ("[yellow]assumption:[/] " if r["assumption"] else "") + r["source"]
        value = r["value"]
        shown = "-" if value is None else value if isinstance(value, str) else f"{value:g}"
        table.add_row(r["field"], shown, source)
    console.print(table)


if __name__ == "__main__":
    app()
