"""The training plan of a job spec: what the `training_plan` asset records and MLflow logs.

    from fm_pipeline.config import load_job
    from fm_pipeline.planner.job_plan import plan_for_job
    plan = plan_for_job(load_job("configs/demo.yaml"))
    plan["estimate"]["mfu"], plan["checkpoint"]["recommended_every_steps"], plan["alternatives"]

The job's declared layout is estimated as is (mesh dp_replicate x dp_shard x pp x tp; FSDP
when dp_shard > 1); the search runs beside it on the same GPUs so the plan shows what the
best alternatives would gain. Nothing here launches anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fm_pipeline.planner.cluster import cluster_from_spec
from fm_pipeline.planner.critique import Finding, critique
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.estimate import estimate
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.placement import rank_table
from fm_pipeline.planner.precision import get_precision
from fm_pipeline.planner.runnable import PLANNER_RECOMPUTE
from fm_pipeline.planner.search import search
from fm_pipeline.planner.shape import shape_from_model_config

PLAN_VERSION = 2  # 2: the critique section


def job_inputs(job) -> dict:
    """Shape, cluster, layout and budgets the planner reads from a JobSpec."""
    p, t = job.parallelism, job.training
    shape = shape_from_model_config(job.model_cfg, seq_len=t.seq_len, name=job.model.size)
    cluster = cluster_from_spec(job.cluster, gpus_per_node=p.nproc_per_node)
    layout = Layout(
        tp=p.tp, pp=p.pp, dp=p.dp, cp=1, micro_batch=t.micro_batch_size,
        virtual_stages=p.pp_virtual_stages, recompute=PLANNER_RECOMPUTE[p.activation_checkpoint],
        sharding=("ddp" if p.resolved_dp_shard == 1 else
                  "zero1" if p.fsdp_keep_gathered else "fsdp"),
        dp_shard=p.resolved_dp_shard if 1 < p.resolved_dp_shard < p.dp else 0,
        schedule=p.pp_schedule, ep=p.ep,
    )
    precision = p.mixed_precision
    if precision.startswith("fp8") and not cluster.accelerator.peak_fp8_flops:
        # FP8 arithmetic without FP8 units (a CPU run) is no faster than the bf16 one.
        precision = "bf16"
    return {
        "shape": shape, "cluster": cluster, "layout": layout,
        "global_batch_tokens": job.tokens_per_step,
        "training_tokens": t.steps * job.tokens_per_step,
        "precision": precision,
        "async_checkpoint": job.checkpoint.async_save,
        "checkpoints_kept": job.checkpoint.keep_last,
    }


def estimate_job(inp: dict):
    """The estimate of the declared layout from `job_inputs`."""
    return estimate(
        inp["shape"],
        inp["cluster"],
        inp["layout"],
        global_batch_tokens=inp["global_batch_tokens"],
        training_tokens=inp["training_tokens"],
        precision=inp["precision"],
        async_checkpoint=inp["async_checkpoint"],
        checkpoints_kept=inp["checkpoints_kept"],
    )


def job_critique(job) -> list[Finding]:
    """What the spec declares that its plan argues against, every finding at once; none for
    a layout the planner cannot model (nothing to argue with)."""
    try:
        inp = job_inputs(job)
        return critique(job, inp, estimate_job(inp))
    except PlanInputError:
        return []


def plan_for_job(job, *, alternatives: int = 3, rank_rows: int = 64) -> dict:
    """The checked plan: predictions for the declared layout, the search's best alternatives,
    the checkpoint interval against the configured one, the critique of what the spec
    declares, and the rank placement."""
    inp = job_inputs(job)
    est = estimate_job(inp)
    found = search(
        inp["shape"],
        inp["cluster"],
        gpus=inp["layout"].gpus,
        global_batch_tokens=inp["global_batch_tokens"],
        top=alternatives,
        precision=inp["precision"],
    )
    rel = est.reliability
    return {
        "version": PLAN_VERSION,
        "job": job.name,
        "model": inp["shape"].describe(),
        "cluster": {
            "accelerator": inp["cluster"].accelerator.name,
            "gpus_per_node": inp["cluster"].gpus_per_node,
            # MFU's denominator: FP8 runs are quoted against the bf16 peak.
            "peak_flops": inp["cluster"].accelerator.peak_flops(
                get_precision(inp["precision"]).compute_dtype),
        },
        "precision": inp["precision"],
        "estimate": est.to_dict(),
        "checkpoint": {
            "configured_every_steps": job.checkpoint.every_steps,
            "recommended_every_steps": rel.interval_steps,
            "recommended_interval_s": rel.interval_s,
            "job_mtbf_h": rel.job_mtbf_h,
            # The fast tier (memory + a peer replica): its interval next to the configured
            # one (0: off), and the durable interval that goes with it; None on one node.
            "configured_memory_every_steps": job.checkpoint.memory_every_steps,
            **_two_level(est.fast_tier),
        },
        "alternatives": [
            {
                "rank": p.rank,
                "layout": p.layout.describe(),
                **_headline(found.metrics(p.index)),
                "reasons": p.reasons,
            }
            for p in found.plans
        ],
        "search": {
            "evaluated": found.evaluated,
            "fitting": found.fitting,
            "seconds": found.seconds,
        },
        "critique": [f.to_dict() for f in critique(job, inp, est)],
        "rank_placement": rank_table(inp["cluster"], inp["layout"], limit=rank_rows),
    }


def _two_level(fast) -> dict:
    if fast is None or not fast.fast_interval_steps:
        return {"recommended_memory_every_steps": None,
                "recommended_every_steps_with_memory": None, "goodput_with_memory": None}
    return {"recommended_memory_every_steps": fast.fast_interval_steps,
            "recommended_every_steps_with_memory": fast.durable_interval_steps,
            "goodput_with_memory": fast.goodput}


def _headline(m: dict) -> dict:
    keys = (
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "memory_gib_per_gpu",
        "bubble_fraction",
        "exposed_comm_fraction",
    )
    return {k: m[k] for k in keys}


def save_plan(plan: dict, path: str | Path) -> Path:
    """Write the plan as JSON atomically (temp file + rename): readers never see half a plan."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plan, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
