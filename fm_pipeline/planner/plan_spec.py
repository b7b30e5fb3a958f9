"""A plan written as the job spec that runs it: model, parallelism, training, checkpoint and
cluster sections the spec loader (fm_pipeline.config) accepts, the inverse of
`job_plan.job_inputs` (a spec written here reads back as the same layout).

    from fm_pipeline.planner.plan_spec import spec_sections
    sections = spec_sections(shape, cluster, layout, global_batch_tokens=16 * 2**20,
                             precision="bf16", checkpoint_every_steps=40)

Layout to mesh: fsdp over all of dp -> dp_shard dp; hybrid fsdp/N -> dp_shard N x
dp_replicate dp/N; ddp -> dp_shard 1 x dp_replicate dp (replicated: DDP's traffic); zero1
-> as fsdp, with fsdp_keep_gathered (weights and gradients whole through the step).
"""

from __future__ import annotations

from fm_pipeline.planner.cluster import ClusterConfig
from fm_pipeline.planner.critique import grace_s_for, segment_steps_for
from fm_pipeline.planner.errors import PlanInputError
from fm_pipeline.planner.layout import Layout
from fm_pipeline.planner.runnable import (
    TRAINER_ACTIVATION_CHECKPOINT,
    balanced_split,
    model_not_runnable,
    not_runnable,
)
from fm_pipeline.planner.shape import ModelShape

# A custom shape is written as this registry size with every shape field overridden.
CUSTOM_BASE = "llama3-8b"
# In-job restarts a written fast-tier plan allows per segment before the orchestrator's
# durable path takes over (a fault that recurs at once is not one the fast tier cures).
INPLACE_RESTARTS = 3


def spec_sections(shape: ModelShape, cluster: ClusterConfig, layout: Layout, *,
                  global_batch_tokens: int, precision: str, checkpoint_every_steps: int,
                  training_steps: int | None = None, estimate=None,
                  memory_every_steps: int = 0) -> dict:
    """The job spec sections for `layout`; PlanInputError names what the trainer cannot run.
    With the layout's `estimate`, segment length and preemption grace period are derived
    from it as the critique would have them (planner.critique). `memory_every_steps` > 0
    turns the fast tier on, with in-job restarts to use it (the planner's two-level
    intervals: then `checkpoint_every_steps` is the durable interval that goes with it)."""
    why = model_not_runnable(shape)
    if why:
        raise PlanInputError("model", why)
    problems = not_runnable(shape, layout, precision=precision)
    if problems:
        raise PlanInputError("layout", "the trainer cannot run it: " + "; ".join(problems))
    gpn = min(cluster.gpus_per_node, layout.gpus)
    if layout.gpus % gpn:
        raise PlanInputError("gpus", f"{layout.gpus} GPUs are not whole nodes of {gpn}")
    shard = layout.shard_group if layout.sharding in ("fsdp", "zero1") else 1
    sequences = global_batch_tokens // shape.seq_len
    parallelism = {
        "nnodes": layout.gpus // gpn, "nproc_per_node": gpn,
        "dp_replicate": layout.dp // shard, "dp_shard": shard, "tp": layout.tp, "pp": layout.pp,
        "pp_schedule": layout.pipeline_schedule, "pp_virtual_stages": layout.virtual_stages,
        "activation_checkpoint": TRAINER_ACTIVATION_CHECKPOINT[layout.recompute],
        "mixed_precision": precision,
        **({"ep": layout.ep} if layout.ep > 1 else {}),
        **({"fsdp_keep_gathered": True} if layout.sharding == "zero1" else {}),
    }
    split = balanced_split(shape.layers, layout.pp * layout.virtual_stages)
    if split is not None:
        parallelism["pp_layers_per_stage"] = split
    training = {"seq_len": shape.seq_len, "global_batch_size": sequences,
                "micro_batch_size": layout.micro_batch}
    if training_steps:
        training["steps"] = training_steps
        training["warmup_steps"] = min(training_steps, max(1, training_steps // 100))
    if estimate is not None and not cluster.accelerator.name.startswith("cpu"):
        every = max(1, checkpoint_every_steps)
        training["segment_steps"] = segment_steps_for(
            estimate, every_steps=every, total_steps=training_steps or every)
        training["preemption_grace_s"] = float(grace_s_for(estimate))
    sections = {
        "model": _model_section(shape),
        "parallelism": parallelism,
        "training": training,
        "checkpoint": {"every_steps": max(1, checkpoint_every_steps)},
        "cluster": _cluster_section(cluster),
    }
    if memory_every_steps > 0:
        sections["checkpoint"]["memory_every_steps"] = memory_every_steps
        sections["resilience"] = {"inplace_restarts": INPLACE_RESTARTS}
    return sections


def _model_section(shape: ModelShape) -> dict:
    from fm_pipeline.model.registry import get_model_config, model_names

    size = shape.name if shape.name in model_names() else CUSTOM_BASE
    base = get_model_config(size)
    wanted = {"n_layers": shape.layers, "dim": shape.hidden, "n_heads": shape.heads,
              "n_kv_heads": shape.kv_heads, "ffn_dim": shape.ffn, "vocab_size": shape.vocab,
              "tie_embeddings": shape.tie_embeddings,
              "max_seq_len": max(base.max_seq_len, shape.seq_len),
              "n_experts": shape.experts, "attn_head_dim": shape.attn_head_dim}
    if shape.experts and size != shape.name:  # a custom MoE: its MoE layers after the dense
        wanted.update(moe_top_k=shape.top_k, moe_ffn_dim=shape.expert_ffn,
                      moe_shared_experts=shape.shared_experts,
                      moe_first_dense=shape.dense_layers, moe_every=1)
    return {"size": size, **{k: v for k, v in wanted.items() if getattr(base, k) != v}}


def _cluster_section(cluster: ClusterConfig) -> dict:
    name = cluster.accelerator.name
    return {
        "accelerator": "cpu" if name.startswith("cpu") else name,
        "gpus_per_node": cluster.gpus_per_node,
        "intra_node_gbps": cluster.intra_node_gbps,
        "inter_node_gbps": cluster.inter_node_gbps,
        "oversubscription": cluster.oversubscription,
        "nodes_per_rack": cluster.nodes_per_rack,
        "fabric": cluster.fabric,
        "leaf_ports": cluster.leaf_ports,
        "ecmp_efficiency": cluster.ecmp_efficiency,
        "region_gpus": cluster.region_gpus,
        "inter_region_gbps": cluster.inter_region_gbps,
        "storage_write_gbps": cluster.storage_write_gbps,
        "dollars_per_gpu_hour": cluster.dollars_per_gpu_hour,
        "restart_overhead_s": cluster.restart_overhead_s,
        **({} if cluster.node_failure_rate_per_day is None
           else {"node_failure_rate_per_day": cluster.node_failure_rate_per_day}),
        **({} if cluster.storage_read_gbps is None
           else {"storage_read_gbps": cluster.storage_read_gbps}),
    }


def job_name(shape: ModelShape, layout: Layout) -> str:
    """A Kubernetes-object name for the plan: `llama3-70b-4096gpu`."""
    base = "".join(ch if ch.isalnum() else "-" for ch in shape.name.lower()).strip("-")
    return f"{base or 'plan'}-{layout.gpus}gpu"[:40].strip("-")
